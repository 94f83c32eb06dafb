"""The biLM training objective: forward and backward LM cross-entropies through one softmax shared by both
directions, computed on the real targets only, with the full softmax or (training only) a sampled softmax.

The sampled softmax is bilm-tf's (TensorFlow's `sampled_softmax_loss` with its default candidate sampler):
`num_sampled` distinct candidates drawn from the log-uniform (Zipfian) distribution over ids, which assumes
the vocabulary is sorted by decreasing frequency; logits are corrected by the log of each id's expected
count, and a candidate equal to the target is removed ("accidental hit"). One candidate set per batch is shared
by both directions. Evaluation always uses the full softmax.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from ..modeling_elmo import ElmoForBidirectionalLM, lm_loss, lm_target_index
from ..runtime import host_index

# Logits computed at once by the full softmax (rows x vocabulary), to bound the memory of evaluation.
FULL_SOFTMAX_CHUNK = 1 << 24


def log_uniform_probability(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """P(id) (float64) of the log-uniform distribution, P(k) = log((k + 2) / (k + 1)) / log(vocab_size + 1)."""
    return torch.log1p(1.0 / (ids.double() + 1.0)) / math.log(vocab_size + 1.0)


def log_uniform_candidates(num_sampled: int, vocab_size: int) -> tuple[torch.Tensor, int]:
    """`num_sampled` distinct ids drawn from the log-uniform distribution (with torch's global RNG, on CPU) and
    the number of draws it took (which gives every id's expected count)."""
    if not 0 < num_sampled < vocab_size:
        raise ValueError(f"num_sampled must lie in [1, vocab_size = {vocab_size}), got {num_sampled}")
    log_range = math.log(vocab_size + 1.0)
    draws = torch.empty(0, dtype=torch.long)
    while True:
        new = (torch.exp(torch.rand(2 * num_sampled, dtype=torch.float64) * log_range) - 1.0).long()
        draws = torch.cat([draws, new.clamp_(0, vocab_size - 1)])
        unique, inverse = torch.unique(draws, return_inverse=True)
        if len(unique) >= num_sampled:
            break
    first_draw = torch.full_like(unique, len(draws)).scatter_reduce(0, inverse, torch.arange(len(draws)), "amin")
    order = first_draw.argsort()[:num_sampled]
    return unique[order], int(first_draw[order[-1]]) + 1


def sampled_softmax_loss(
    hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_sampled: int
) -> torch.Tensor:
    """Per-row loss (rows,) of hidden (rows, P) → targets (rows,) through softmax weight (V, P), bias (V,)."""
    vocab_size = weight.shape[0]
    candidates, num_tries = log_uniform_candidates(num_sampled, vocab_size)
    candidates = host_index(candidates, hidden.device)  # drawn on the host: no wait for the device

    def log_expected_count(ids: torch.Tensor) -> torch.Tensor:
        # P(id drawn at least once in num_tries draws), as TensorFlow's unique sampler reports it.
        probability = log_uniform_probability(ids, vocab_size)
        return torch.log(-torch.expm1(num_tries * torch.log1p(-probability))).float()

    return _SampledSoftmaxLoss.apply(
        hidden, targets, weight, bias, candidates, log_expected_count(targets), log_expected_count(candidates)
    )


class _SampledSoftmaxLoss(torch.autograd.Function):
    """The sampled softmax loss and its gradient in few passes over the (rows, num_sampled) logits, which dominate
    its cost: logits = hidden @ W[candidates]ᵀ + corrected biases, accidental hits set to -inf one by one, then
    loss = logsumexp([true, sampled]) - true, with the probabilities kept for the backward pass (gradient
    p - onehot). Matmuls run in the autocast dtype when autocast is on, the softmax in float32."""

    @staticmethod
    def forward(ctx, hidden, targets, weight, bias, candidates, log_count_targets, log_count_candidates):
        dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) else None
        with torch.autocast(hidden.device.type, enabled=False):
            compute = dtype or hidden.dtype
            h = hidden.to(compute)
            w_candidates, w_targets = weight[candidates].to(compute), weight[targets].to(compute)
            true = (h * w_targets).sum(-1).float() + bias[targets].float() - log_count_targets
            corrected = (bias[candidates].float() - log_count_candidates).to(compute)
            logits = torch.addmm(corrected, h, w_candidates.T).float()  # (rows, num_sampled)
            # A candidate equal to a row's target is removed from that row ("accidental hit").
            position = torch.full((weight.shape[0],), -1, dtype=torch.long, device=hidden.device)
            position[candidates] = torch.arange(len(candidates), device=hidden.device)
            hit = position[targets][:, None]
            removed = torch.where(hit >= 0, float("-inf"), logits.gather(1, hit.clamp(min=0)))
            logits.scatter_(1, hit.clamp(min=0), removed)  # no host sync: rows without a hit rewrite a logit
            top = torch.maximum(logits.amax(dim=1), true) if logits.shape[1] else true
            probabilities = logits.sub_(top[:, None]).exp_()  # in place: the logits are not needed again
            true_exp = torch.exp(true - top)
            total = probabilities.sum(dim=1) + true_exp
            loss = torch.log(total) + top - true
            probabilities.div_(total[:, None])
        ctx.save_for_backward(h, w_candidates, w_targets, targets, candidates, probabilities, true_exp / total)
        ctx.vocab = weight.shape
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype)
        ctx.used = False
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        if ctx.used:
            raise RuntimeError("the sampled softmax loss supports one backward pass (its buffers are reused)")
        ctx.used = True
        h, w_candidates, w_targets, targets, candidates, probabilities, true_probability = ctx.saved_tensors
        hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
        grad_loss = grad_loss.float()
        grad_sampled = probabilities.mul_(grad_loss[:, None])  # (rows, num_sampled): p * dloss
        grad_true = (true_probability - 1.0) * grad_loss  # (rows,): (p_true - 1) * dloss
        compute = h.dtype
        with torch.autocast(h.device.type, enabled=False):
            grad_sampled_c = grad_sampled.to(compute)
            grad_hidden = grad_sampled_c @ w_candidates + grad_true[:, None].to(compute) * w_targets
            grad_weight = torch.zeros(ctx.vocab, dtype=torch.float32, device=h.device)
            grad_weight.index_add_(0, candidates, (grad_sampled_c.T @ h).float())
            grad_weight.index_add_(0, targets, grad_true[:, None] * h.float())
            grad_bias = torch.zeros(ctx.vocab[0], dtype=torch.float32, device=h.device)
            grad_bias.index_add_(0, candidates, grad_sampled.sum(dim=0))
            grad_bias.index_add_(0, targets, grad_true)
        return (grad_hidden.to(hidden_dtype), None, grad_weight.to(weight_dtype), grad_bias.to(bias_dtype),
                None, None, None)


def full_softmax_loss(
    hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Per-row cross-entropy (rows,) over the whole vocabulary, computed in chunks of rows."""
    if not len(targets):
        return hidden.new_zeros(0, dtype=torch.float32)
    rows = max(1, FULL_SOFTMAX_CHUNK // weight.shape[0])
    chunks = zip(hidden.split(rows), targets.split(rows))
    return torch.cat([F.cross_entropy(F.linear(h, weight, bias).float(), y, reduction="none") for h, y in chunks])


@dataclass
class BidirectionalLMLossOutput(ModelOutput):
    """
    Args:
        loss (`torch.FloatTensor`): 0.5 * (mean forward CE + mean backward CE) of the batch (sampled in training
            with `num_sampled`).
        forward_loss_sum, backward_loss_sum (`torch.FloatTensor`, detached): summed CE of each direction.
        n_targets (`torch.LongTensor`): targets per direction (words + one `</S>` per line for the forward LM).
    """

    loss: torch.FloatTensor | None = None
    forward_loss_sum: torch.FloatTensor | None = None
    backward_loss_sum: torch.FloatTensor | None = None
    n_targets: torch.LongTensor | None = None


class BidirectionalLMLoss(nn.Module):
    """The training module around an `ElmoForBidirectionalLM` (`self.lm`): its biLM and its shared softmax.

    Args:
        lm: the biLM with its softmax.
        num_sampled: candidates of the sampled softmax in training; 0 = full softmax.

    `encoder_frozen = True` trains the softmax alone (no gradient reaches the biLM), e.g. first when the biLM
    comes from weights without a softmax.
    """

    def __init__(self, lm: ElmoForBidirectionalLM, num_sampled: int = 0):
        super().__init__()
        if num_sampled and num_sampled >= lm.config.vocab_size:
            raise ValueError(
                f"num_sampled ({num_sampled}) must be smaller than the vocabulary ({lm.config.vocab_size}); "
                "use the full softmax (num_sampled 0)"
            )
        self.lm = lm
        self.num_sampled = num_sampled
        self.encoder_frozen = False

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        lengths: Sequence[int] | None = None,
        forward_index: torch.Tensor | None = None,
        backward_index: torch.Tensor | None = None,
    ) -> BidirectionalLMLossOutput:
        """input_ids (batch, positions, chars), attention_mask and labels (batch, positions), the rows' lengths on
        the host and the batch's `lm_target_index` on the labels' device, as `encode_batch` makes them (without the
        index, it is found from the labels, a host synchronisation on a GPU): the forward LM at position t predicts
        labels[t + 1], the backward LM labels[t - 1]."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.encoder_frozen):
            outputs, forward_states, backward_states = self.lm.lm_states(input_ids, attention_mask, lengths=lengths)
        if forward_index is None or backward_index is None:
            forward_index, backward_index = lm_target_index(outputs.attention_mask, labels)
        hidden = torch.cat([forward_states.flatten(0, 1)[forward_index],
                            backward_states.flatten(0, 1)[backward_index + 1]])
        flat_labels = labels.flatten()
        targets = torch.cat([flat_labels[forward_index + 1], flat_labels[backward_index]])
        softmax = self.lm.get_output_embeddings()
        if self.training and self.num_sampled:
            losses = sampled_softmax_loss(hidden, targets, softmax.weight, softmax.bias, self.num_sampled)
        else:
            losses = full_softmax_loss(hidden, targets, softmax.weight, softmax.bias)
        n_forward = len(forward_index)  # a shape: known on the host
        forward_losses, backward_losses = losses[:n_forward], losses[n_forward:]
        loss = lm_loss(forward_losses, backward_losses)
        forward_sum, backward_sum = forward_losses.sum(), backward_losses.sum()
        return BidirectionalLMLossOutput(
            loss=loss,
            forward_loss_sum=forward_sum.detach(),
            backward_loss_sum=backward_sum.detach(),
            n_targets=torch.full((), n_forward, device=labels.device),
        )
