"""Rows as tensors (`fic.training.vasd.batches`): teacher sequences that share a prompt are read
once, as branches of one row, with the hidden states of separate rows."""

from __future__ import annotations

import torch

from fic.training.vasd.batches import hidden_at, packed_sequences


def test_teacher_rows_that_share_a_prompt_are_read_once_with_the_same_hidden_states():
    """hidden_at(share_prefixes=True): sequences that share at least half their ids with the row
    before them ride on it as branches (`packed_sequences`), one that does not starts a row; the
    hidden states at every asked position are those of the separate rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    system = list(range(10, 40))
    sequences = [system + [50, 51, 52, 53], system + [50, 60, 61], system[:5] + [70, 71, 72, 73, 74, 75],
                 system[:5] + [70, 71, 80]]
    rows, where = packed_sequences(sequences)
    assert [len(r["input_ids"]) for r in rows] == [34 + 2, 11 + 1]
    assert where == [(0, 34, 0), (0, 31, 34), (1, 11, 0), (1, 7, 11)]
    assert rows[0]["position_ids"][34:] == [31, 32] and rows[0]["limits"][34:] == [31, 31]
    assert rows[1]["segments"] == [0] * 11 + [1]
    torch.manual_seed(0)
    net = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2)).eval()
    positions = [range(29, 34), [30, 31, 32], [0, 4, 9, 10], [3, 6, 7]]
    apart = hidden_at(net, sequences, positions, 0, "cpu", 64)
    shared = hidden_at(net, sequences, positions, 0, "cpu", 64, share_prefixes=True)
    assert apart.shape == (15, 32) and torch.allclose(apart, shared, atol=1e-5)
