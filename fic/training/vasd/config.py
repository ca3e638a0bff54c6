"""The settings of the VASD recipe (`fic/train_vasd.py`, `fic train vasd --keys`): one section
per part of a step, each field documented by its help text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fic.conversation.users import UserSimulatorSection
from fic.core.config import setting
from fic.core.errors import FicError
from fic.data.sources import InstancesSection
from fic.data.splits import ExcludeSection
from fic.data.views import check_views
from fic.training.config import DevSection, LoggingSection, RunConfig, TrainSection
from fic.training.data import TARGET_KINDS
from fic.training.losses import DIVERGENCES, ESTIMATORS

MUST_MATCH = ("model.path", "model.dtype", "lora", "data", "exclude", "rollout", "teacher.mode", "teacher.view",
              "train.micro_batch_size", "train.grad_accum_steps", "train.seed", "train.loss_chunk_tokens",
              "reward.group_size",
              "regularizer.kind", "regularizer.anchor_share",
              "regularizer.anchor_targets", "regularizer.anchor_path", "regularizer.anchor_max_seq_len")
REGULARIZERS = ("anchor", "reference", "both", "none")
EMA_WITH_REFERENCE = ("in full fine-tuning teacher.mode=ema with a reference term would need a third copy of the model "
                      "(the average, and the starting weights the reference reads): use LoRA, teacher.mode=frozen "
                      "or live, or regularizer.kind=anchor")
TEACHER_VIEWS = ("full", "concat", "both", "hinted")
TURNS = ("final", "all")


@dataclass
class RolloutSection:
    shuffle: bool = setting(True, "Visit the rollout tasks in a seeded random order (data.seed), a new permutation "
                            "each epoch.")
    backend: str = setting("hf", "hf: this process's live model generates (CPU or GPU); vllm: a colocated vLLM "
                           "engine whose weights are synced after every optimizer step (GPU).", choices=("hf", "vllm"))
    temperature: float = setting(1.0, "Sampling temperature of every assistant reply. Greedy rollouts give too few "
                                 "wrong final replies to learn from.", min=0.0)
    top_p: float = setting(1.0, "Nucleus sampling threshold.", min=0.0, max=1.0)
    max_new_tokens: int = setting(256, "Most tokens of one reply; a final reply cut here is counted as truncated.",
                                  min=1)
    max_conversation_tokens: int = setting(4096, "Most tokens of a whole rollout (prompts and replies); a "
                                           "conversation that would grow past it ends early and is left out.", min=16)
    batch_size: int = setting(16, "Most conversations per generation forward pass (hf).", min=1)
    kv_reuse_mb: float = setting(1024, "hf: memory for keys and values kept between turns of a rollout (0: off); "
                                 "cleared after every optimizer step.", min=0)
    user: UserSimulatorSection = setting(UserSimulatorSection(), "The simulated user: verbatim shards (default) or an LLM user.")
    gpu_memory_utilization: float = setting(0.3, "vllm: share of GPU memory for the engine; the trainer keeps the "
                                            "rest.", min=0.01, max=1.0)
    logprob_check_tolerance: float = setting(0.05, "vllm: warn when the engine's mean log-prob of a rollout differs "
                                             "from the trainer's by more than this after a weight sync.", min=0.0)


@dataclass
class TeacherSection:
    mode: str = setting("frozen", "frozen: the starting weights (LoRA: adapters off, no copy); live: the current "
                        "weights under no-grad; ema: a moving average of the weights (accumulated in float32).",
                        choices=("frozen", "live", "ema"))
    view: str = setting("full", "The teacher's single-turn view: full (the original instruction), concat (the shards "
                        "as one list), both (their next-token distributions averaged) or hinted (the full view "
                        "followed by the reference answer: a teacher that knows what is right; pair it with "
                        "loss.max_log_ratio, since a privileged teacher pulls the student towards answering "
                        "at once).", choices=TEACHER_VIEWS)
    ema_rate: float = setting(0.99, "ema: weight of the old average at each step.", min=0.0, max=1.0)
    max_prompt_tokens: int = setting(4096, "The teacher's own context budget for its prompt (never cut to the "
                                     "student's); a rollout whose teacher prompt is longer is left out.", min=8)


@dataclass
class LossSection:
    weight: float = setting(1.0, "Weight of the divergence term (0: no teacher pass at all, e.g. on-policy "
                            "corrections alone: corrections.weight).", min=0.0)
    divergence: str = setting("forward_kl", "forward_kl: KL(teacher || student); reverse_kl: KL(student || teacher); "
                              "jsd: generalised Jensen-Shannon with loss.beta.", choices=DIVERGENCES)
    beta: float = setting(0.5, "jsd: weight of the teacher in the mixture (0.5: symmetric JSD).", min=0.0, max=1.0)
    estimator: str = setting("full", "full: the whole vocabulary (fp32, in chunks); topk: the student's top-k tokens "
                             "plus a tail bucket; sampled: the sampled token only (reverse_kl).", choices=ESTIMATORS)
    top_k: int = setting(64, "topk: tokens kept per position.", min=1)
    temperature: float = setting(1.0, "Applied to both sides' logits before the divergence (not rescaled by T^2).",
                                 min=0.01)
    keep_truncated: bool = setting(False, "Distill final replies cut by rollout.max_new_tokens too (they are counted "
                                   "either way).")
    turns: str = setting("final", "final: the divergence on the final reply, against the whole request (the paper's "
                         "VASD); all: on every reply, reply k against the single-turn request of what the user had "
                         "revealed by turn k (per-turn view asymmetry: the teacher sees an incomplete request as "
                         "one, where asking is easier to get right).", choices=TURNS)
    nonfinal_weight: float = setting(1.0, "turns=all: weight of an earlier reply's tokens next to the final reply's.",
                                     min=0.0)
    nonfinal_tokens: int = setting(0, "turns=all: distill only the first this many tokens of each earlier reply, "
                                   "where it asks or answers (0: the whole reply); the final reply is distilled "
                                   "whole.", min=0)
    max_log_ratio: float = setting(0.0, "Trust region on the teacher (0: off): at each distilled token the target is "
                                   "the teacher's distribution with log p_teacher - log p_student clipped to "
                                   "[-c, c] and renormalised, so no token's pull exceeds a factor e^c over what the "
                                   "student already gives it (a guard for the hinted teacher's drift).", min=0.0)
    decision_tokens: int = setting(0, "The first this many tokens of each distilled reply weigh decision_weight: "
                                   "the ask-or-answer decision is made there.", min=0)
    decision_weight: float = setting(1.0, "Weight of those first tokens.", min=0.0)


@dataclass
class LabelsSection:
    weight: float = setting(0.0, "Weight of on-policy deferral labels (0: off): at the student's own earlier turns "
                            "(its own replies, premature answers included, in the context), cross-entropy on the "
                            "reply the corpus builder writes for that state (an ask for the next detail or a "
                            "deferral): imitation on the states the policy visits, as in DAgger.", min=0.0)
    select: str = setting("earliest", "Which earlier turns get a label. earliest: up to max_turns, its premature "
                          "answers first, then its earliest other turns; premature: every premature answer (up to "
                          "max_turns), or the last turn before the final one when nothing was premature; "
                          "unanswerable: every premature answer given before the request was answerable "
                          "(`Task.answerable`: in actions, a required argument missing; every premature answer "
                          "where the task cannot tell), and nothing else: no deferral is taught where the "
                          "request was complete but more was still to come.",
                          choices=("earliest", "premature", "unanswerable"))
    max_turns: int = setting(1, "Labelled turns per rollout, at most.", min=1)
    ask_share: float = setting(0.5, "Share of labels that ask for the next detail rather than defer.", min=0.0,
                               max=1.0)


@dataclass
class CorrectionsSection:
    weight: float = setting(0.0, "Weight of on-policy corrections (0: off), DAgger-style with the corpus builder as "
                            "the expert: a rollout that answered before the last shard is continued from its first "
                            "premature turn with the gold asks and deferrals and the gold answer at the end (the "
                            "student's own earlier ids kept, out of the loss); one whose final answer scored 0 gets "
                            "the gold answer in its own context. Cross-entropy on the gold replies.", min=0.0)
    ask_share: float = setting(0.5, "Share of gold early replies that ask for the next detail rather than defer.",
                               min=0.0, max=1.0)


@dataclass
class RewardSection:
    weight: float = setting(0.0, "Weight of a policy-gradient term on a verifiable reward (0: off), group-relative "
                            "as in RLOO: each task is played group_size times a step, a rollout's reward is its "
                            "final answer's score, discounted when it answered early (premature_penalty), and its "
                            "advantage is that reward minus the mean of the group's other rollouts. Every reply "
                            "token of the rollout, the ask-or-answer ones included, is trained with cross-entropy "
                            "at rollout.temperature (the distribution it was sampled from) weighted by the "
                            "advantage. Untuned; the discount of a premature call follows RLAAR (arXiv 2510.18731).", min=0.0)
    group_size: int = setting(4, "Rollouts of each task per step; it divides train.micro_batch_size x "
                              "train.grad_accum_steps, so a step plays that many over group_size tasks.", min=2)
    premature_penalty: float = setting(1.0, "An early answer's reward is the final score times 1 - this (1: an "
                                       "early call earns nothing, however the conversation ends).", min=0.0, max=1.0)
    penalize: str = setting("premature", "Which early answers are discounted. premature: any answer attempt before "
                            "the last shard; unanswerable: only one made before the request was answerable "
                            "(`Task.answerable`; where the task cannot tell, as premature).",
                            choices=("premature", "unanswerable"))
    unanswered_reward: float = setting(0.0, "The reward of a rollout whose final reply, after the last shard, is no "
                                       "answer attempt, in place of its score (0: off, it keeps its last answer's score, 0 "
                                       "if it never answered). Below 0 an ask at the end scores worse than a wrong "
                                       "call; at 0 one dev seed learned to ask at the last shard (docs/results.md).",
                                       min=-1.0, max=0.0)


@dataclass
class RegularizerSection:
    kind: str = setting("anchor", "anchor: cross-entropy on SFT-corpus conversations mixed into each batch, on the "
                        "turns anchor_targets names (by default every trained assistant turn); reference: divergence "
                        "to the starting model on the rollouts' earlier replies; both; none.", choices=REGULARIZERS)
    anchor_share: float = setting(0.5, "Anchor conversations per rollout conversation.", min=0.0)
    anchor_weight: float = setting(1.0, "Weight of the anchor term next to the distillation term.", min=0.0)
    anchor_targets: str = setting("assistant", "Which SFT-corpus turns the anchor trains: assistant (every trained "
                                  "turn: deferrals, asks and the final answers, so both decisions are kept) or "
                                  "non_final (deferrals and asks only; on its own it can teach the model to defer "
                                  "even when the request is complete).", choices=TARGET_KINDS)
    anchor_path: str = setting("", "SFT corpus (JSONL from `fic sft-data`) the anchor trains on; needed when kind is "
                               "anchor or both.")
    anchor_max_seq_len: int = setting(2048, "Anchor conversations longer than this many tokens are skipped.", min=8)
    reference_weight: float = setting(1.0, "Weight of the reference term next to the distillation term.", min=0.0)
    first_tokens: int = setting(4, "The first this many tokens of each non-final reply weigh first_token_weight.",
                                min=0)
    first_token_weight: float = setting(4.0, "Weight of those first tokens (the defer-or-answer decision).", min=0.0)


@dataclass
class VASDLoggingSection(LoggingSection):
    samples_every: int = setting(10, "Write sample conversations (samples.jsonl, wandb table) every this many "
                                 "steps (0: never).", min=0)


@dataclass
class VASDTrainSection(TrainSection):
    share_prefixes: bool = setting(True, "A rollout's label and correction rows (its own ids up to an earlier turn, "
                                   "then gold replies) ride on its row as branches that attend to the shared "
                                   "context, which is computed once, and its teacher rows (one system prompt, the "
                                   "requests a few words apart) on one another: the same losses and gradients as "
                                   "separate rows, fewer positions (sdpa attention; false: one sequence a row).")


@dataclass
class VASDConfig(RunConfig):
    """Settings of the VASD recipe (`fic/train_vasd.py`, `fic train vasd`)."""

    data: InstancesSection = setting(InstancesSection(source=["reasoning-gym:gsm_symbolic"], limit=1000, seed=1),
                                     "The rollout tasks; instances with fewer than 2 shards are left out.")
    exclude: ExcludeSection = setting(ExcludeSection(), "Evaluation data the rollouts must not see "
                                      "(fic.data.splits); the overlap found is logged and written to "
                                      "out/data_overlap.json.")
    train: VASDTrainSection = setting(VASDTrainSection(), "Steps, batch sizes, precision.")
    rollout: RolloutSection = setting(RolloutSection(), "On-policy rollouts of the sharded view.")
    teacher: TeacherSection = setting(TeacherSection(), "The single-turn teacher.")
    loss: LossSection = setting(LossSection(), "The divergence to the single-turn teacher.")
    labels: LabelsSection = setting(LabelsSection(), "On-policy deferral labels at the student's earlier turns.")
    corrections: CorrectionsSection = setting(CorrectionsSection(), "On-policy corrections: gold continuations from "
                                              "the student's own premature or wrong turns.")
    reward: RewardSection = setting(RewardSection(), "A group-relative policy-gradient term on a verifiable reward "
                                    "that discounts early answers.")
    regularizer: RegularizerSection = setting(RegularizerSection(), "What keeps the deferral SFT taught.")
    dev: DevSection = setting(DevSection(views=["full", "sharded"]), "The live model scored on held-out dev tasks "
                              "as it trains.")
    logging: VASDLoggingSection = setting(VASDLoggingSection(), "wandb, metrics, progress and samples.")
    out: str = setting("runs/vasd", "Output folder: config, metrics, samples, checkpoints, final model.")

    # Keys an older FiC read, and where they went: a config that still names one fails in one line.
    RENAMED: ClassVar[dict[str, str]] = {"eval": "dev (the same keys)", **{f"eval.{k}": f"dev.{k}" for k in ("every", "data", "views",
                                                                                   "max_new_tokens")}}

    def check(self, source: str) -> None:
        super().check(source)
        if self.train.max_steps is None:
            raise FicError("VASD runs a set number of steps: set train.max_steps", path=source, field="train.max_steps")
        if self.loss.estimator == "sampled" and self.loss.divergence != "reverse_kl":
            raise FicError("the sampled-token estimator estimates reverse_kl only; set loss.divergence=reverse_kl or "
                           "another estimator", path=source, field="loss.estimator")
        if self.loss.estimator == "sampled" and self.loss.temperature != self.rollout.temperature:
            raise FicError("the sampled-token estimator needs loss.temperature equal to rollout.temperature (tokens "
                           "must be sampled from the distribution the loss reads)", path=source, field="loss.temperature")
        if self.loss.divergence == "jsd" and not 0 < self.loss.beta < 1:
            raise FicError("jsd needs 0 < loss.beta < 1 (0 and 1 are forward_kl and reverse_kl)", path=source,
                           field="loss.beta")
        if not self.data.source:
            raise FicError("expected at least one source of rollout tasks", path=source, field="data.source")
        if self.regularizer.kind in ("anchor", "both") and not self.regularizer.anchor_path:
            raise FicError(f"regularizer.kind={self.regularizer.kind} needs the SFT corpus whose deferrals it keeps",
                           path=source, field="regularizer.anchor_path")
        if self.teacher.mode == "ema" and not self.lora.enabled and self.regularizer.kind in ("reference", "both"):
            raise FicError(EMA_WITH_REFERENCE, path=source, field="teacher.mode")
        check_views(self.dev.views, source, "dev.views", allow_empty=True)
        if not (self.loss.weight or self.labels.weight or self.corrections.weight or self.reward.weight):
            raise FicError("nothing to train: loss.weight, labels.weight, corrections.weight and reward.weight are "
                           "all 0", path=source, field="loss.weight")
        if self.reward.weight:
            per_rank = self.train.micro_batch_size * self.train.grad_accum_steps
            if per_rank % self.reward.group_size:
                raise FicError(f"reward.group_size {self.reward.group_size} must divide the {per_rank} rollouts a "
                               "process plays a step (train.micro_batch_size x train.grad_accum_steps)", path=source,
                               field="reward.group_size")
            if self.rollout.temperature <= 0:
                raise FicError("the reward's group needs sampled rollouts: greedy ones are all alike, so every "
                               "advantage is 0; set rollout.temperature > 0", path=source, field="rollout.temperature")
        if self.loss.max_log_ratio and self.loss.estimator != "full":
            raise FicError("loss.max_log_ratio needs the full-vocabulary estimator", path=source,
                           field="loss.max_log_ratio")
        if self.dev.every and not self.dev.data.source:
            raise FicError("dev.every is set but dev.data.source is empty", path=source, field="dev.data.source")
