"""The encoder of the biattentive classification network (BCN; McCann et al. 2017), the paper's SST-5 task model:
a ReLU feedforward, a biLSTM, self-biattention and an integrating biLSTM, on one text at a time."""

from __future__ import annotations

import torch
from thinc.api import Model
from thinc.types import Padded
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .pytorch import padded_module


class BiattentiveEncoder(torch.nn.Module):
    """(n_steps, n_texts, n_in) padded texts and their lengths -> (n_steps, n_texts, width) integrated encodings.

    Every text attends to itself (the BCN's two inputs are the same text for classification): with X the biLSTM's
    states, C = softmax(X X^T) X over the text's own tokens, and the integrating biLSTM reads [X; X - C; X * C].
    Padding never reaches a real token: both biLSTMs run on packed sequences and attention is masked, so a text's
    encodings do not depend on its batch.
    """

    def __init__(self, n_in: int, width: int, feedforward_width: int, dropout: float):
        super().__init__()
        if width % 2:
            raise ValueError(f"BiattentiveEncoder: width must be even (two directions), got {width}")
        self.feedforward = torch.nn.Sequential(torch.nn.Linear(n_in, feedforward_width), torch.nn.ReLU(),
                                               torch.nn.Dropout(dropout))
        self.encoder = torch.nn.LSTM(feedforward_width, width // 2, bidirectional=True)
        self.integrator = torch.nn.LSTM(3 * width, width // 2, bidirectional=True)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """inputs (T, B, n_in), lengths (B,) on the CPU, longest first -> (T, B, width)."""
        n_steps, n_texts = inputs.shape[:2]
        if n_steps == 0 or n_texts == 0:  # no texts, or only empty ones
            # (connected to the inputs, so that a training batch of empty texts backpropagates zeros)
            return inputs.new_zeros(n_steps, n_texts, 2 * self.integrator.hidden_size) + 0.0 * inputs.sum()
        lengths = lengths.clamp(min=1)  # an empty text runs as one zero row (dropped again by the caller)
        states = self._bilstm(self.encoder, self.feedforward(inputs), lengths, n_steps).transpose(0, 1)  # (B, T, w)
        padding = (torch.arange(n_steps)[None, :] >= lengths[:, None]).to(inputs.device)  # (B, T)
        affinity = (states @ states.transpose(1, 2)).masked_fill(padding[:, None, :], float("-inf"))
        context = torch.softmax(affinity, dim=-1) @ states  # (B, T, width)
        integrator_input = torch.cat([states, states - context, states * context], dim=-1).transpose(0, 1)
        return self._bilstm(self.integrator, integrator_input, lengths, n_steps)

    @staticmethod
    def _bilstm(lstm: torch.nn.LSTM, inputs: torch.Tensor, lengths: torch.Tensor, n_steps: int) -> torch.Tensor:
        """(T, B, n) with CPU lengths sorted longest first -> (T, B, width), zeros after each text's end."""
        packed = pack_padded_sequence(inputs, lengths, enforce_sorted=True)
        return pad_packed_sequence(lstm(packed)[0], total_length=n_steps)[0]


def biattentive_encoder(n_in: int, width: int, feedforward_width: int, dropout: float) -> Model[Padded, Padded]:
    """`BiattentiveEncoder` as a Thinc layer on `Padded` texts (use inside `with_padded`)."""
    return padded_module(BiattentiveEncoder(n_in, width, feedforward_width, dropout), with_lengths=True)
