"""`hf_elmo.formulas`: each step of the biLM, written once for the reference blocks and the kernels, against torch's
own layers and the paper's equations element by element (the oracles do not share the formulas' code)."""

import pytest
import torch
import torch.nn.functional as F

from hf_elmo.formulas import LstmWeights, convolve_pool_activate, highway, lstm_cell, project_tokens


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_convolve_pool_activate_is_conv1d_max_pooled_then_activated(activation):
    torch.manual_seed(0)
    chars = torch.randn(5, 12, 4)  # (words, chars, char_dim)
    filters = [(torch.randn(3, 4, 1), torch.randn(3)), (torch.randn(6, 4, 3), torch.randn(6))]
    act = torch.tanh if activation == "tanh" else F.relu
    expected = torch.cat([act(F.conv1d(chars.transpose(1, 2), w, b).amax(dim=-1)) for w, b in filters], dim=-1)
    torch.testing.assert_close(convolve_pool_activate(chars, filters, activation, F.linear), expected)


def test_highway_is_the_gated_sum_of_the_transform_and_the_input():
    torch.manual_seed(0)
    x, layers = torch.randn(7, 4), [(torch.randn(8, 4), torch.randn(8)) for _ in range(2)]
    expected = x
    for weight, bias in layers:
        transform, gate = expected @ weight[:4].T + bias[:4], torch.sigmoid(expected @ weight[4:].T + bias[4:])
        expected = gate * torch.relu(transform) + (1 - gate) * expected
    torch.testing.assert_close(highway(x, layers, F.linear), expected)
    assert highway(x, [], F.linear) is x


def test_project_tokens_puts_the_word_vector_first_and_projects_if_there_is_a_projection():
    torch.manual_seed(0)
    highway_output, words, projection = torch.randn(3, 4), torch.randn(3, 2), (torch.randn(5, 6), torch.randn(5))
    torch.testing.assert_close(project_tokens(highway_output, words, projection, F.linear),
                               torch.cat([words, highway_output], -1) @ projection[0].T + projection[1])
    assert project_tokens(highway_output, None, None, F.linear) is highway_output


@pytest.mark.parametrize("clip", [None, 0.5])
def test_lstm_cell_is_the_papers_cell_in_tensorflows_gate_order_with_its_clips(clip):
    """Gates (input i, candidate j, forget f, output o): c' = σ(f) c + σ(i) tanh(j), clipped; h' = P(σ(o) tanh(c')),
    clipped."""
    torch.manual_seed(0)
    cell, hidden = 6, 4
    gates, c = torch.randn(2, 3, 4 * cell) * 3, torch.randn(2, 3, cell)
    projection = torch.randn(2, hidden, cell)
    weights = LstmWeights(torch.empty(2, 4 * cell, 5), torch.empty(2, 4 * cell, hidden), torch.empty(2, 4 * cell),
                          projection, clip, clip, 1.0)
    i, j, f, o = gates.chunk(4, dim=-1)
    expected_c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
    expected_c = expected_c if clip is None else expected_c.clamp(-clip, clip)
    expected_h = torch.bmm(torch.sigmoid(o) * torch.tanh(expected_c), projection.transpose(1, 2))
    expected_h = expected_h if clip is None else expected_h.clamp(-clip, clip)
    h, new_c = lstm_cell(weights, gates, c, lambda h: torch.bmm(h, projection.transpose(1, 2)))
    torch.testing.assert_close(new_c, expected_c)
    torch.testing.assert_close(h, expected_h)
    assert weights.fused_exact is (clip is None)
