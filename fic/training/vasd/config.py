"""The settings of the VASD recipe (`fic/train_vasd.py`, `fic train vasd --keys`): the paper's
VASD in the core sections (rollouts, teacher, the divergence, the anchor), every other arm a
plug-in term under `terms:` (one section per file of `fic/training/vasd/terms/`), the dev tasks in
the section SFT's dev curve uses. Each field is documented by its help text; every rule between
settings is checked in `VASDConfig.check`, when the config loads."""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from fic.conversation.users import UserSimulatorSection
from fic.core.bounds import MAX_BATCH, MAX_MIB, MAX_REPEATS, MAX_STEPS, MAX_VOCAB
from fic.core.config import setting
from fic.core.errors import FicError
from fic.data.sources import InstancesSection
from fic.data.splits import ExcludeSection
from fic.data.views import check_views
from fic.training.config import DevSection, LoggingSection, RunConfig, TrainSection, moved_key
from fic.training.data import TARGET_KINDS
from fic.training.losses import DIVERGENCES, ESTIMATORS
from fic.training.vasd.terms import PLUGINS, run_terms

# Settings a resumed run must share with the checkpoint: anything else changes what the saved
# optimizer state, RNG and data position mean.
MUST_MATCH = ("model.path", "model.dtype", "lora", "data", "exclude", "rollout", "teacher.mode", "teacher.view",
              "train.micro_batch_size", "train.grad_accum_steps", "train.seed", "train.loss_chunk_tokens",
              "anchor.share", "anchor.targets", "anchor.path", "anchor.max_seq_len",
              *(key for plugin in PLUGINS for key in plugin.must_match))
TEACHER_VIEWS = ("full", "concat", "both", "gold-hinted")


@dataclass
class RolloutSection:
    shuffle: bool = setting(True, "Visit the rollout tasks in a seeded random order (data.seed), a new permutation "
                            "each epoch.")
    backend: str = setting("hf", "hf: this process's live model generates (CPU or GPU); vllm: a colocated vLLM "
                           "engine whose weights are synced after every optimizer step (GPU).", choices=("hf", "vllm"))
    temperature: float = setting(1.0, "Sampling temperature of every assistant reply. Greedy rollouts give too few "
                                 "wrong final replies to learn from.", min=0.0, unbounded="a sampling temperature: logits are divided by it")
    top_p: float = setting(1.0, "Nucleus sampling threshold.", min=0.0, max=1.0)
    max_new_tokens: int = setting(256, "Most tokens of one reply; a final reply cut here is counted as truncated.",
                                  min=1)
    max_conversation_tokens: int = setting(4096, "Most tokens of a whole rollout (prompts and replies); a "
                                           "conversation that would grow past it ends early and is left out.", min=16)
    batch_size: int = setting(16, "Most conversations per generation forward pass (hf).", min=1,
                            max=MAX_BATCH)
    kv_reuse_mb: float = setting(1024, "hf: memory for keys and values kept between turns of a rollout (0: off); "
                                 "cleared after every optimizer step.", min=0, max=MAX_MIB)
    user: UserSimulatorSection = setting(UserSimulatorSection(), "The simulated user: verbatim shards (default) or an LLM user.")
    gpu_memory_utilization: float = setting(0.3, "vllm: share of GPU memory for the engine; the trainer keeps the "
                                            "rest.", min=0.01, max=1.0)
    logprob_check_tolerance: float = setting(0.05, "vllm: warn when the engine's mean log-prob of a rollout differs "
                                             "from the trainer's by more than this after a weight sync.", min=0.0, unbounded="a warning threshold")


@dataclass
class TeacherSection:
    mode: str = setting("frozen", "frozen: the starting weights (LoRA: adapters off, no copy); live: the current "
                        "weights under no-grad; ema: a moving average of the weights (accumulated in float32).",
                        choices=("frozen", "live", "ema"))
    view: str = setting("full", "The teacher's single-turn view: full (the original instruction), concat (the shards "
                        "as one list), both (their next-token distributions averaged) or gold-hinted (the full view "
                        "followed by the reference answer: a teacher that reads the gold, so not label-free; pair it with "
                        "loss.max_log_ratio, since a privileged teacher pulls the student towards answering "
                        "at once).", choices=TEACHER_VIEWS)
    ema_rate: float = setting(0.99, "ema: weight of the old average at each step.", min=0.0, max=1.0)
    max_prompt_tokens: int = setting(4096, "The teacher's own context budget for its prompt (never cut to the "
                                     "student's); a rollout whose teacher prompt is longer is left out.", min=8)


@dataclass
class LossSection:
    weight: float = setting(1.0, "Weight of the divergence term (0: no teacher pass at all, e.g. a plug-in term "
                            "alone: terms.corrections.weight).", min=0.0, unbounded="a loss term's weight: it scales a number, not work")
    divergence: str = setting("forward_kl", "forward_kl: KL(teacher || student); reverse_kl: KL(student || teacher); "
                              "jsd: generalised Jensen-Shannon with loss.beta.", choices=DIVERGENCES)
    beta: float = setting(0.5, "jsd: weight of the teacher in the mixture (0.5: symmetric JSD).", min=0.0, max=1.0)
    estimator: str = setting("full", "full: the whole vocabulary (fp32, in chunks); topk: the student's top-k tokens "
                             "plus a tail bucket; sampled: the sampled token only (reverse_kl).", choices=ESTIMATORS)
    top_k: int = setting(64, "topk: tokens kept per position.", min=1, max=MAX_VOCAB)
    temperature: float = setting(1.0, "Applied to both sides' logits before the divergence (not rescaled by T^2).",
                                 min=0.01, unbounded="a sampling temperature: logits are divided by it")
    keep_truncated: bool = setting(False, "Distill final replies cut by rollout.max_new_tokens too (they are counted "
                                   "either way).")
    max_log_ratio: float = setting(0.0, "Trust region on the teacher (0: off): at each distilled token the target is "
                                   "the teacher's distribution with log p_teacher - log p_student clipped to "
                                   "[-c, c] and renormalised, so no token's pull exceeds a factor e^c over what the "
                                   "student already gives it (a guard for the hinted teacher's drift).", min=0.0, unbounded="a clip in log-probability units")

    @classmethod
    def moved(cls, data: dict, unknown: list[str]) -> tuple[str, str] | None:  # plug-ins' keys once in this section
        return moved_key({old.removeprefix("loss."): new for plugin in PLUGINS for old, new in plugin.renamed.items()
                          if old.startswith("loss.")}, data, unknown)


@dataclass
class AnchorSection:
    share: float = setting(0.5, "Anchor conversations per rollout conversation (0: no anchor): cross-entropy on "
                           "SFT-corpus conversations mixed into each batch, on the turns `targets` names. The "
                           "teacher has the whole request, so it always wants an answer at once; the anchor keeps "
                           "the deferrals SFT taught.", min=0.0, max=MAX_REPEATS)
    weight: float = setting(1.0, "Weight of the anchor term next to the distillation term.", min=0.0, unbounded="a loss term's weight: it scales a number, not work")
    targets: str = setting("assistant", "Which SFT-corpus turns the anchor trains: assistant (every trained turn: "
                           "deferrals, asks and the final answers, so both decisions are kept) or non_final "
                           "(deferrals and asks only; on its own it can teach the model to defer even when the "
                           "request is complete).", choices=TARGET_KINDS)
    path: str = setting("", "SFT corpus (JSONL from `fic sft-data`) the anchor trains on; needed when share > 0.")
    max_seq_len: int = setting(2048, "Anchor conversations longer than this many tokens are skipped.", min=8)
    first_tokens: int = setting(4, "The first this many tokens of each trained reply (the anchor's, and a plug-in's "
                                "gold replies) weigh first_token_weight.", min=0)
    first_token_weight: float = setting(4.0, "Weight of those first tokens (the defer-or-answer decision).", min=0.0, unbounded="a token weight")


# One section per plug-in term, each its own file's settings.
TermsSection = make_dataclass("TermsSection", [(plugin.name, plugin.section, setting(plugin.section(), plugin.help))
                                               for plugin in PLUGINS])
TermsSection.__module__, TermsSection.__doc__ = __name__, "The plug-in terms (fic/training/vasd/terms/), each off by default."


@dataclass
class VASDLoggingSection(LoggingSection):
    samples_every: int = setting(10, "Write sample conversations (samples.jsonl, wandb table) every this many "
                                 "steps (0: never).", min=0, max=MAX_STEPS)
    term_grad_norms_every: int = setting(0, "Log each loss term's own gradient norm (grad_norm_<term>, beside the "
                                         "total's grad_norm) every this many steps (0: never): whether the "
                                         "divergence or the anchor steers the update. Costs one more backward "
                                         "pass and one float32 copy of the trained weights a term on those "
                                         "steps; one process or DDP only (not ZeRO-3 or FSDP).",
                                         min=0, max=MAX_STEPS)


@dataclass
class VASDTrainSection(TrainSection):
    share_prefixes: bool = setting(True, "A rollout's plug-in gold rows (its own ids up to an earlier turn, then "
                                   "gold replies) ride on its row as branches that attend to the shared context, "
                                   "which is computed once, and its teacher rows (one system prompt, the requests a "
                                   "few words apart) on one another: the same losses and gradients as separate "
                                   "rows, fewer positions (sdpa attention; false: one sequence a row).")


# Keys an older FiC read, and where they went: a config that still names one fails in one line.
_ANCHOR = {"anchor_share": "share", "anchor_weight": "weight", "anchor_targets": "targets", "anchor_path": "path",
           "anchor_max_seq_len": "max_seq_len"}
OLD_KEYS = {"eval": "dev (the same keys)", **{f"eval.{k}": f"dev.{k}" for k in ("every", "data", "views",
                                                                                   "max_new_tokens")},
           "regularizer": "anchor.* (the reference term: terms.reference.*)",
           "regularizer.kind": "anchor.share (0: no anchor) and terms.reference.weight (> 0: the reference term)",
           **{f"regularizer.{old}": f"anchor.{new}" for old, new in _ANCHOR.items()},
           "regularizer.first_tokens": "anchor.first_tokens (the reference term's: terms.reference.first_tokens)",
           "regularizer.first_token_weight": "anchor.first_token_weight (the reference term's: "
                                             "terms.reference.first_token_weight)",
           **{old: new for plugin in PLUGINS for old, new in plugin.renamed.items() if not old.startswith("loss.")}}


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
    loss: LossSection = setting(LossSection(), "The divergence to the single-turn teacher at the final reply.")
    anchor: AnchorSection = setting(AnchorSection(), "The anchor: what keeps the deferrals SFT taught.")
    terms: TermsSection = setting(TermsSection(), "Plug-in terms beyond the paper's VASD, each off by default.")
    dev: DevSection = setting(DevSection(views=["full", "sharded"]), "The live model scored on held-out dev tasks "
                              "as it trains.")
    logging: VASDLoggingSection = setting(VASDLoggingSection(), "wandb, metrics, progress and samples.")
    out: str = setting("runs/vasd", "Output folder: config, metrics, samples, checkpoints, final model.")

    @classmethod
    def moved(cls, data: dict, unknown: list[str]) -> tuple[str, str] | None:
        return moved_key(OLD_KEYS, data, unknown)

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
        if self.anchor.share > 0 and not self.anchor.path:
            raise FicError("anchor.share > 0 needs the SFT corpus whose deferrals the anchor keeps (or anchor.share=0: "
                           "no anchor)", path=source, field="anchor.path")
        check_views(self.dev.views, source, "dev.views", allow_empty=True)
        if not run_terms(self, anchors=False):
            raise FicError("nothing to train: loss.weight is 0 and no plug-in term is on (terms.*.weight)",
                           path=source, field="loss.weight")
        if self.loss.max_log_ratio and self.loss.estimator != "full":
            raise FicError("loss.max_log_ratio needs the full-vocabulary estimator", path=source,
                           field="loss.max_log_ratio")
        if self.dev.every and not self.dev.data.source:
            raise FicError("dev.every is set but dev.data.source is empty", path=source, field="dev.data.source")
        for plugin in PLUGINS:
            if plugin.check is not None:
                plugin.check(self, source)
