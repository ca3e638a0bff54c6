"""The teacher's single-turn prompts (`fic.training.vasd.prompts`)."""

from __future__ import annotations

from vasd_played import ara

from fic.training.vasd.prompts import HINT, teacher_prompts


def test_the_hinted_teacher_reads_the_full_request_and_the_reference_answer_and_nothing_else(smollm2_tokenizer):
    (full, hinted) = teacher_prompts(smollm2_tokenizer, ara(), ["full", "gold-hinted"])
    full_text, hinted_text = smollm2_tokenizer.decode(full), smollm2_tokenizer.decode(hinted)
    cut = full_text.rindex("<|im_end|>")  # the end of the user turn
    assert hinted_text == full_text[:cut] + HINT.format(answer="3360") + full_text[cut:]
