"""Tasks whose answer is free text: data2text (ToTTo), translation (WMT19 de->en) and summary
(Summary of a Haystack), as Lost in Conversation keeps them.

In all three the user asks for an updated answer at every turn, so LiC sends their user turns as
written (never rephrased by the user simulator) and counts every reply as an answer attempt
(`fixed_turns`, `replies_are_answers`); the whole reply is the answer.

- data2text: keys `table_highlighted_html`, `fewshot_descriptions`, `metadata`, `references`;
  shards are sent verbatim. Score: BLEU of the reply against the references (sacrebleu's
  corpus BLEU, one hypothesis, several references) / 100.
- translation: keys `document_de`, `document_en`; shard k is the k-th chunk of the German
  document, framed as a live transcription. Score: BLEU against `document_en` / 100.
- summary: keys `topic`, `query`, `domain`, `documents` (`document_index`, `document_text`),
  `insights`, `insightid2ref_citations`; a shard names documents (`doc_idxs`, its own text is
  empty) and turn k brings them. Scoring needs an LLM judge (SummHay's joint score: for each
  reference insight the judge says whether a bullet of the summary covers it fully (1), partly
  (0.5) or not; that coverage times the F1 of the bullet's citations `[i, j]` against the
  insight's documents, averaged over insights). The judge is any backend, handed to `scored`
  by its caller (`fic eval`'s `judge:` section, through the simulator); the task never builds or
  keeps one. Without a judge a summary scores 0 with a note saying so.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.core.instance import Instance
from fic.core.optional import need
from fic.core.parsing import find_json
from fic.tasks import lic_prompts
from fic.tasks.base import ErrorFactory, Task

TEXT_ASKS = (
    "Noted. Please send the rest.",
    "Got it. What else is there?",
    "Thanks. Please share the next part.",
)


def bleu(hypothesis: str, references: list[str]) -> float:
    """sacrebleu's corpus BLEU of one hypothesis against its references, in [0, 1] (LiC's score)."""
    sacrebleu = need("sacrebleu", "BLEU scoring (translation, data2text)")  # imported when scoring: slow to load

    score = sacrebleu.corpus_bleu([hypothesis.strip()], [[ref.strip()] for ref in references]).score / 100.0
    return min(score, 1.0)  # float rounding can put a perfect match a hair above 1


class _TextTask(Task):
    fixed_turns = True
    replies_are_answers = True

    def extract_answer(self, text: str) -> str | None:
        return text.strip() or None

    @property
    def generic_asks(self) -> tuple[str, ...]:  # type: ignore[override]
        return TEXT_ASKS


class Data2TextTask(_TextTask):
    name = "data2text"
    scoring_needs = ("sacrebleu",)  # BLEU
    system_prompt = "You are a helpful assistant that describes tables in one short sentence."
    required_fields = ("table_highlighted_html", "fewshot_descriptions")
    INSTRUCTION = ("Write a one-sentence description (at most 30 words) of the highlighted cells of the table "
                   "below. Reply with the sentence only.")

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        super().validate_fields(fields, error)
        references = fields.get("references")
        if not isinstance(references, list) or not references or not all(isinstance(r, str) for r in references):
            raise error("expected a non-empty list of reference sentences", "references")
        if not isinstance(fields.get("metadata", {}), dict):
            raise error("expected an object of table metadata (page and section titles)", "metadata")

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        return lic_prompts.DATA2TEXT_SYSTEM if prompts == "lic" else self.system_prompt

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        fields = instance.fields
        metadata = (fields.get("metadata") or {}).items()
        if prompts == "lic":
            context = "".join(lic_prompts.fill(lic_prompts.DATA2TEXT_CONTEXT_LINE, KEY=str(key), VALUE=str(value))
                              for key, value in metadata)
            return lic_prompts.fill(lic_prompts.DATA2TEXT_FULL, TABLE_HTML=fields["table_highlighted_html"],
                                    FEWSHOT_DESCRIPTIONS=fields["fewshot_descriptions"], CONTEXT=context)
        context = "\n".join(f"{key}: {value}" for key, value in metadata)
        return (f"{self.INSTRUCTION}\n\nTable:\n{fields['table_highlighted_html']}\n\n{context}\n\n"
                f"Examples of descriptions of other tables:\n{fields['fewshot_descriptions']}")

    def concat_turn(self, instance: Instance, contents: list[str], prompts: str = "fic") -> str:
        if prompts == "lic":  # LiC's full prompt without table and examples, the hints (by shard id) as context
            hints = "".join(lic_prompts.fill(lic_prompts.DATA2TEXT_HINT, SHARD_ID=str(shard.shard_id), SHARD=text)
                            for shard, text in zip(self.shards_in_order(instance, contents), contents))
            return lic_prompts.fill(lic_prompts.DATA2TEXT_FULL, TABLE_HTML="", FEWSHOT_DESCRIPTIONS="", CONTEXT=hints)
        hints = "\n\n".join(f"Hint {k}:\n{text}" for k, text in enumerate(contents, start=1))
        return f"{self.INSTRUCTION}\n\n{hints}"

    def score(self, text: str, instance: Instance) -> float:
        return bleu(text, instance.fields["references"])

    def reference_answer(self, instance: Instance) -> str:
        return instance.fields["references"][0]

    def gold_reply(self, instance: Instance) -> str:
        return self.reference_answer(instance)

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        return rng.choice(("The table lists several events with their dates and places.",
                           "The table gives a list of entries and their details.",
                           "This table summarises a set of records."))


class TranslationTask(_TextTask):
    name = "translation"
    scoring_needs = ("sacrebleu",)  # BLEU
    system_prompt = "You are a helpful assistant that translates German into English."
    required_fields = ("document_de", "document_en")
    FIRST = ("I'm translating a German document into English while it is being transcribed, and I'll send it "
             "in chunks. At every turn, reply with the English translation of the whole document so far (not "
             "only the last chunk); you may correct earlier parts.\n\nChunk 1:\n\n{chunk}")
    NEXT = "Here is the next chunk. Translate the whole document so far.\n\nChunk {k}:\n\n{chunk}"

    def validate_shards(self, instance: Instance, error: ErrorFactory) -> None:
        # LiC's own file has two documents whose last chunk is empty; they are sent as they are.
        if instance.shards and not instance.shards[0].shard.strip():
            raise error("expected the first chunk of the German document, got empty text", "shards[0].shard")

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        return lic_prompts.TRANSLATION_SYSTEM if prompts == "lic" else self.system_prompt

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        german = instance.fields["document_de"]
        if prompts == "lic":
            return lic_prompts.fill(lic_prompts.TRANSLATION_FULL, GERMAN_TEXT=german)
        return "Translate this German text into English. Reply with the translation only.\n\n" + german

    def sharded_turns(self, instance: Instance, prompts: str = "fic") -> list[str]:
        chunks = self.shard_contents(instance)
        if prompts == "lic":
            return [lic_prompts.fill(lic_prompts.TRANSLATION_FIRST, CHUNK=chunks[0]),
                    *(lic_prompts.fill(lic_prompts.TRANSLATION_NEXT, K=str(k), CHUNK=chunk)
                      for k, chunk in enumerate(chunks[1:], start=2))]
        return [self.FIRST.format(chunk=chunks[0]),
                *(self.NEXT.format(k=k, chunk=chunk) for k, chunk in enumerate(chunks[1:], start=2))]

    def concat_turn(self, instance: Instance, contents: list[str], prompts: str = "fic") -> str:
        if prompts == "lic":
            document = lic_prompts.TRANSLATION_CONCAT_HEADER + "".join(
                lic_prompts.fill(lic_prompts.TRANSLATION_CONCAT_CHUNK, K=str(k), CHUNK=text)
                for k, text in enumerate(contents, start=1))
            return lic_prompts.fill(lic_prompts.TRANSLATION_FULL, GERMAN_TEXT=document)
        chunks = "\n\n".join(f"Chunk {k}:\n{text}" for k, text in enumerate(contents, start=1))
        return ("Translate these chunks of a German document into English, as one document without the chunk "
                f"labels. Reply with the translation only.\n\n{chunks}")

    def score(self, text: str, instance: Instance) -> float:
        return bleu(text, [instance.fields["document_en"]])

    def reference_answer(self, instance: Instance) -> str:
        return instance.fields["document_en"]

    def gold_reply(self, instance: Instance) -> str:
        return self.reference_answer(instance)

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        """The reference translation of the chunks revealed so far (lines align with the German)."""
        english = instance.fields["document_en"].splitlines()
        german_lines = sum(len(s.splitlines()) for s in instance.shard_texts[:len(revealed_texts)])
        return "\n".join(english[:german_lines]) or english[0]


class SummaryTask(_TextTask):
    name = "summary"
    system_prompt = "You are a helpful assistant that writes summaries with citations."
    required_fields = ("topic", "query")
    INSTRUCTION = (
        "Here are documents about: {topic}\n\n{documents}"
        "Write a summary of what these documents say about this question: {query}\n"
        "Write it as bullet points, one insight per bullet, and cite the documents each bullet comes from "
        "as [i, j] with their numbers. There are about {insights} insights to find.")
    NEXT = ("I found a few more documents. Rewrite the summary taking every document so far into account "
            "(the earlier ones and these).\n\n{documents}")

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        super().validate_fields(fields, error)
        documents = fields.get("documents")
        if not isinstance(documents, list) or not all(isinstance(d, dict) and isinstance(d.get("document_index"), int)
                                                      and isinstance(d.get("document_text"), str) for d in documents):
            raise error("expected a list of {document_index: int, document_text: str}", "documents")
        if not isinstance(fields.get("insights"), list) or not all(
                isinstance(i, dict) and "insight" in i and "insight_id" in i for i in fields["insights"]):
            raise error("expected a list of {insight_id, insight}", "insights")
        if not isinstance(fields.get("insightid2ref_citations"), dict):
            raise error("expected an object mapping insight ids to document numbers", "insightid2ref_citations")

    def validate_shards(self, instance: Instance, error: ErrorFactory) -> None:
        known = {d["document_index"] for d in instance.fields["documents"]}
        for index, shard in enumerate(instance.shards):
            named = shard.extra.get("doc_idxs")
            if not isinstance(named, list) or not named or any(i not in known for i in named):
                raise error(f"expected a list of this instance's document numbers, got {named!r:.60}",
                            f"shards[{index}].doc_idxs")

    def _documents(self, instance: Instance, indexes: list[int]) -> str:
        texts = {d["document_index"]: d["document_text"] for d in instance.fields["documents"]}
        unknown = [i for i in indexes if i not in texts]
        if unknown:
            raise FicError(f"a shard names documents {unknown} that the instance does not have",
                           record=instance.task_id, field="shards.doc_idxs")
        return "".join(f"Document {i}:\n{texts[i]}\n\n" for i in indexes)

    def shard_contents(self, instance: Instance) -> list[str]:
        return [self._documents(instance, shard.extra.get("doc_idxs") or []).strip() for shard in instance.shards]

    def _prompt(self, instance: Instance, documents: str) -> str:
        fields = instance.fields
        return self.INSTRUCTION.format(topic=fields["topic"], documents=documents, query=fields["query"],
                                       insights=len(fields["insights"]))

    def scoring_caveats(self, judged: bool = False) -> list[str]:
        if judged:
            return []
        return ["no judge (judge.model unset): every summary scores 0"]

    def _lic_prompt(self, instance: Instance, documents: str) -> str:
        fields = instance.fields
        template = lic_prompts.SUMMARY_FULL_CONV if fields.get("domain") == "conv" else lic_prompts.SUMMARY_FULL_NEWS
        return lic_prompts.fill(template, TOPIC=fields["topic"], DOCUMENTS=documents, QUERY=fields["query"],
                                N_DOCS=str(len(fields["documents"])), N_INSIGHTS=str(len(fields["insights"])))

    def _lic_documents(self, instance: Instance, indexes: list[int]) -> str:
        texts = {d["document_index"]: d["document_text"] for d in instance.fields["documents"]}
        return "".join(lic_prompts.fill(lic_prompts.SUMMARY_DOCUMENT, INDEX=str(i), TEXT=texts[i]) for i in indexes)

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        return lic_prompts.SUMMARY_SYSTEM if prompts == "lic" else self.system_prompt

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        every = [d["document_index"] for d in instance.fields["documents"]]
        if prompts == "lic":
            return self._lic_prompt(instance, self._lic_documents(instance, every))
        return self._prompt(instance, self._documents(instance, every))

    def sharded_turns(self, instance: Instance, prompts: str = "fic") -> list[str]:
        if prompts == "lic":  # turn k brings shard k's documents (LiC's code sends shard k-1's again)
            documents = [self._lic_documents(instance, shard.extra.get("doc_idxs") or []) for shard in instance.shards]
            return [self._lic_prompt(instance, documents[0]),
                    *(lic_prompts.fill(lic_prompts.SUMMARY_NEXT, DOCUMENTS=d) for d in documents[1:])]
        chunks = self.shard_contents(instance)
        return [self._prompt(instance, chunks[0] + "\n\n"), *(self.NEXT.format(documents=c) for c in chunks[1:])]

    def concat_turn(self, instance: Instance, contents: list[str], prompts: str = "fic") -> str:
        if prompts == "lic":
            documents = lic_prompts.SUMMARY_CONCAT_HEADER + "".join(
                lic_prompts.fill(lic_prompts.SUMMARY_CONCAT_CHUNK, K=str(k))
                + self._lic_documents(instance, shard.extra.get("doc_idxs") or [])
                for k, shard in enumerate(self.shards_in_order(instance, contents), start=1))
            return self._lic_prompt(instance, documents)
        chunks = "".join(f"Document chunk {k}:\n{text}\n\n" for k, text in enumerate(contents, start=1))
        return self._prompt(instance, "The documents came in chunks; treat them all alike.\n\n" + chunks)

    # ------------------------------------------------------------------ judging

    def scored(self, text: str, instance: Instance, judge: Any = None) -> tuple[float, str | None]:
        if judge is None:
            return 0.0, "not judged: summary scoring needs an LLM judge (set judge.model in the eval config)"

        bullets = summary_bullets(text)
        listing = json.dumps([{"bullet_id": k, "text": b} for k, b in enumerate(bullets, start=1)], indent=1)
        prompts = [[{"role": "system", "content": JUDGE_RULES},
                    {"role": "user", "content": f"Bullets:\n{listing}\n\nInsight: {insight['insight']}"}]
                   for insight in instance.fields["insights"]]
        outputs = judge.chat(prompts, SamplingParams(max_new_tokens=96, temperature=0.0, seed=0))
        total, unreadable = 0.0, 0
        for insight, output in zip(instance.fields["insights"], outputs):
            verdict = _verdict(output.text, len(bullets))
            if verdict is None:
                unreadable += 1
                continue
            coverage, bullet = verdict
            if coverage and bullet is not None:
                cited = set(citations(bullets[bullet - 1]))
                wanted = set(instance.fields["insightid2ref_citations"].get(insight["insight_id"], []))
                total += coverage * _f1(cited, wanted)
        score = total / max(len(instance.fields["insights"]), 1)
        return score, (f"{unreadable} judge verdict(s) unreadable, counted as not covered" if unreadable else None)

    def score(self, text: str, instance: Instance) -> float:
        return self.scored(text, instance)[0]

    def reference_answer(self, instance: Instance) -> str:
        return self.gold_reply(instance)

    def gold_reply(self, instance: Instance) -> str:
        """Every insight as a bullet citing its documents among this instance's."""
        shown = {d["document_index"] for d in instance.fields["documents"]}
        lines = []
        for insight in instance.fields["insights"]:
            cited = sorted(set(instance.fields["insightid2ref_citations"].get(insight["insight_id"], [])) & shown)
            lines.append(f"- {insight['insight']}" + (f" [{', '.join(map(str, cited))}]" if cited else ""))
        return "\n".join(lines)

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        return "- The documents so far do not address the question directly."


JUDGE_RULES = """\
You check whether a summary covers one insight. The summary is a list of numbered bullets. \
Say whether one bullet covers the insight fully (FULL), covers part of it (PARTIAL), or whether \
no bullet covers it (NONE), and which bullet. Reply with only a JSON object: \
{"coverage": "FULL" | "PARTIAL" | "NONE", "bullet_id": <number or null>}"""
MAX_SUMMARY_WORDS = 300  # SummHay trims longer summaries proportionally before judging


def summary_bullets(summary: str) -> list[str]:
    """The summary's lines, trimmed proportionally to 300 words in all (SummHay's rule)."""
    lines = [line for line in summary.splitlines() if line.strip()] or [summary]
    words = sum(len(line.split()) for line in lines)
    if words <= MAX_SUMMARY_WORDS:
        return lines
    keep = 1 - (words - MAX_SUMMARY_WORDS) / words
    return [" ".join(line.split()[:max(1, int(len(line.split()) * keep))]) for line in lines]


def citations(bullet: str) -> list[int]:
    return [int(n) for group in re.findall(r"\[([\d,\s]+)\]", bullet) for n in re.findall(r"\d+", group)]


def _verdict(text: str, bullets: int) -> tuple[float, int | None] | None:

    obj = find_json(text or "")
    if not isinstance(obj, dict):
        return None
    coverage = {"FULL": 1.0, "FULL_COVERAGE": 1.0, "PARTIAL": 0.5, "PARTIAL_COVERAGE": 0.5,
                "NONE": 0.0, "NO_COVERAGE": 0.0}.get(str(obj.get("coverage", "")).upper())
    if coverage is None:
        return None
    bullet = obj.get("bullet_id")
    bullet = int(bullet) if isinstance(bullet, (int, str)) and str(bullet).isdigit() else None
    return coverage, bullet if bullet is not None and 1 <= bullet <= bullets else None


def _f1(cited: set, wanted: set) -> float:
    hit = len(cited & wanted)
    if not hit:
        return 0.0
    precision, recall = hit / len(cited), hit / len(wanted)
    return 2 * precision * recall / (precision + recall)

