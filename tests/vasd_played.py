"""What the VASD tests share: a four-shard math task, its conversation played by a scripted
assistant, a step's window run through the teacher pass, and the recipe's settings on a tiny model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from scripted import FunctionBackend
from templates import LLAMA3

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.generation import SamplingParams
from fic.core.instance import Instance, Shard
from fic.training.vasd.rows import Reply
from fic.training.vasd.teacher import teacher_pass
from fic.training.vasd.terms import run_terms
from fic.training.vasd.window import step_rows

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2-135m-instruct" / "vasd.yaml"


def ara(task_id: str = "ara") -> Instance:
    shards = ["How many points did Ara score in total?", "Ara played for 4 years.", "She played 40 games every year.",
              "She scored 21 points in each game."]
    return Instance(task_id, "math", [Shard(i + 1, s) for i, s in enumerate(shards)],
                    {"question": "Ara played 4 years, 40 games a year, 21 points a game. How many points in total?",
                     "answer": "40*4*21 = 3360\n#### 3360"})


def played(tokenizer, final: str = "So 4 * 40 * 21 = 3360.\n#### 3360", max_new_tokens: int = 64):
    """A sharded conversation played token-in/token-out by a scripted assistant."""
    backend = FunctionBackend(lambda prompt: final if "21 points" in prompt else "Got it, go on.", tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], 1)
    play([conv], backend, VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=max_new_tokens),
         stop_at_correct=False)
    return conv


def play_scripted(instance, reply, tokenizer, max_new_tokens: int = 64):
    """`instance` played sharded by an assistant that writes `reply(prompt)`."""
    (conv,) = make_conversations([instance], ["sharded"], 1)
    play([conv], FunctionBackend(reply, tokenizer), VerbatimUser(), RuleClassifier(),
         SamplingParams(max_new_tokens=max_new_tokens), stop_at_correct=False)
    return conv


def final_only(rollout, prompts=None):
    """The paper's VASD: only the final reply is distilled, with weight 1."""
    rollout.replies = [Reply(rollout.final, prompts if prompts is not None else [[]])]
    return rollout


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def with_template(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    if template is not None:
        tok.chat_template = template
    if template is LLAMA3:  # its markup tokens, as a Llama 3 tokenizer has them
        tok.add_tokens(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                       special_tokens=True)
        tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    return tok


def window(cfg, convs, tokenizer, parts, anchors=(), **kwargs):
    """A step's batches for `convs` (and `anchors`) as the step builds them on a CPU: the rows
    (`step_rows`) through the teacher pass; and what was left out."""
    terms = run_terms(cfg, anchors=bool(anchors))
    micro_batches, left_out = step_rows(cfg, convs, list(anchors), tokenizer, terms, **kwargs)
    return teacher_pass(micro_batches, parts, terms, tokenizer.pad_token_id, device="cpu",
                        autocast=no_autocast), left_out


def settings(model_dir, anchor, out, *extra) -> list[str]:
    """The recipe on a tiny model: 2 x 2 rollouts of 6 tokens a step, the anchor on `anchor`."""
    return [f"model.path={model_dir}", "data.source=reasoning-gym:gsm_symbolic", "data.limit=16", "data.seed=9",
            f"anchor.path={anchor}", f"out={out}", "train.micro_batch_size=2", "train.grad_accum_steps=2",
            "rollout.max_new_tokens=6", "loss.keep_truncated=true", "optim.lr=1e-3", "logging.wandb=false",
            "logging.progress=false", "logging.samples_every=0", *extra]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
