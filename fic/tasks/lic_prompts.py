"""Lost in Conversation's task prompts, verbatim, for `prompts: lic` (`fic eval`, `fic views`).

Reproduced as data from microsoft/lost_in_conversation (commit ba6b9a2, files under `prompts/`
as named above each constant; the strings LiC builds in its Python code are after them, named by
the file and function they come from). The `[[NAME]]` slots are LiC's; `fill` fills them in the
order LiC does. FiC's own prompts (`prompts: fic`, the default) are in the task modules; what
still differs from LiC under `lic` is listed in docs/evaluation.md. LiC's prompts of the user
simulator and the classifier are with them, in `fic.conversation.lic_prompts`; its recap and
snowball turns with the views (`fic.data.views`).

Lost in Conversation is released under the MIT License:

    MIT License

    Copyright (c) Microsoft Corporation.

    Permission is hereby granted, free of charge, to any person obtaining a copy
    of this software and associated documentation files (the "Software"), to deal
    in the Software without restriction, including without limitation the rights
    to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
    copies of the Software, and to permit persons to whom the Software is
    furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all
    copies or substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
    IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
    FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
    AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
    LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
    OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
    SOFTWARE
"""

from __future__ import annotations

# prompts/math/math_system_prompt.txt
MATH_SYSTEM = (
    "As an expert problem solver solve step by step the following mathematical questions."
)

# prompts/math/math_full_prompt.txt
MATH_FULL = (
    "Q: [[QUESTION]]\n"
    "A:"
)

# prompts/database/database_system_prompt.txt
DATABASE_SYSTEM = (
    "You are helping a user write SQL queries to a database. If something is not clear, you can ask "
    "the user to clarify what they need. The schema for the database being accessed is the "
    "following:\n"
    "        \n"
    "[[SCHEMA]]"
)

# prompts/database/database_full_prompt.txt
DATABASE_FULL = (
    "You must generate the valid SQL query that answers the given user query in natural language.\n"
    "\n"
    "The schema of the database you are responding to is as follows:\n"
    "[[DATABASE_SCHEMA]]\n"
    "\n"
    "The user query is:\n"
    "[[USER_QUERY]]\n"
    "\n"
    "Rules:\n"
    "- [Single Answer] Produce a single valid SQL query based on the database schema and the user "
    "query.\n"
    "- [Only SQL] Do not include any other text or comments.\n"
    "- [Validity] The SQL query must be valid and executable.\n"
    "- [Single Line] Produce your entire response in a single line."
)

# prompts/actions/actions_system_prompt.txt
ACTIONS_SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls to "
    "achieve the purpose.\n"
    "If none of the functions can be used, point it out. If the given question lacks the parameters "
    "required by the function, also point it out.\n"
    "You should only return the function calls in your response.\n"
    "\n"
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n"
    "You SHOULD NOT include any other text in the response.\n"
    "\n"
    "Here is a list of functions in JSON format that you can invoke.\n"
    "\n"
    "[[FUNCTIONS]]"
)

# prompts/actions/actions_full_prompt.txt
ACTIONS_FULL = (
    "[[QUESTION]]"
)

# prompts/lcb/lcb_system_prompt.txt
CODE_SYSTEM = (
    "You are an expert Python programmer. You will be given a question (problem specification) and "
    "will generate a correct Python program that matches the specification and passes all tests.\n"
    "\n"
    "Format:\n"
    "- [Standalone] Make sure that your answer consists of only one Python function at the top "
    "level. Do not wrap with a class or split into multiple functions."
)

# prompts/lcb/lcb_full_prompt.txt
LCB_FULL = (
    "### Question:\n"
    "[[QUESTION]]\n"
    "\n"
    "### Format: [[FORMATTING_PREAMBLE]]\n"
    "[[FORMATTING]]\n"
    "\n"
    "### Answer: (use the provided format with backticks)\n"
)

# prompts/humaneval/humaneval_full_prompt.txt
HUMANEVAL_FULL = (
    "You must generate a valid Python function that satisfies the following instruction:\n"
    "\n"
    "Instruction:\n"
    "\n"
    "[[INSTRUCTION]]\n"
    "\n"
    "Rules:\n"
    "- [Format] You must only return the Python function, matching the signature exactly.\n"
    "- [Validity] The Python function must be valid and executable. Do not include any other text or "
    "comments. (```python```)"
)

# prompts/translation/translation_system_prompt.txt
TRANSLATION_SYSTEM = (
    "You are a professional German to English translator. Translate the given German text into "
    "natural, fluent English while preserving the original meaning and style. "
)

# prompts/translation/translation_full_prompt.txt
TRANSLATION_FULL = (
    "Please translate the following German text into English:\n"
    "\n"
    "[[GERMAN_TEXT]] "
)

# prompts/data2text/data2text_system_prompt.txt
DATA2TEXT_SYSTEM = (
    "You are an analyst with an eye for detail that accomplishes tasks carefully and thoroughly."
)

# prompts/data2text/data2text_full_prompt.txt
DATA2TEXT_FULL = (
    "Please generate a one-sentence description of the following table. Focus on the highlighted "
    "cells if present.\n"
    "\n"
    "Table:\n"
    "[[TABLE_HTML]]\n"
    "\n"
    "Consider the following context:\n"
    "[[CONTEXT]]\n"
    "\n"
    "Here are some examples of descriptions of other tables. You can use it as references to "
    "understand how to describe the table:\n"
    "[[FEWSHOT_DESCRIPTIONS]]\n"
    "\n"
    "Generate a clear and natural one-sentence description."
)

# prompts/summary/summary_system_prompt.txt
SUMMARY_SYSTEM = (
    "You are a professional document analyst. You receive documents and are tasked with writing "
    "specific summaries of the document, which you do carefully."
)

# prompts/summary/summary_full_prompt_conv.txt
SUMMARY_FULL_CONV = (
    "You are given [[N_DOCS]] conversations within the following scenario: \"[[TOPIC]]\".\n"
    "In each conversation, the participants might be different, with different names, but all the "
    "conversations fall into the same scenario.\n"
    "\n"
    "```\n"
    "[[DOCUMENTS]]\n"
    "```\n"
    "\n"
    "Your objective is to produce a summary of all the document with [[N_INSIGHTS]] bullet points "
    "covering the main insights regarding the following query: [[QUERY]].\n"
    "Careful:\n"
    "- [Format] You should format your summary as a bullet point list, where each bullet point is a "
    "different insight.\n"
    "- [References] For each insight, you should refer to the relevant conversations by using the "
    "IDs given in the conversation list. For example: \"some of the doctors ask patients for their "
    "medical history[1][4]\" which means that the insight is supported by Document 1 and Document 4. "
    "No need to say \"Conversation 14\", you can just use the following structure: \"[14]\".\n"
    "- [Length] Your summary should be no longer than 300 words in total."
)

# prompts/summary/summary_full_prompt_news.txt
SUMMARY_FULL_NEWS = (
    "You are given [[N_DOCS]] news articles about the main subject \"[[TOPIC]].\"\n"
    "\n"
    "```\n"
    "[[DOCUMENTS]]\n"
    "```\n"
    "\n"
    "In some of the conversation the following topic is discussed: \"[[QUERY]]\".\n"
    "Your objective is to summarize the [[N_INSIGHTS]] main insights from the conversations "
    "regarding that topic.\n"
    "Careful:\n"
    "- [Format] You should format your summary as a bullet point list, where each bullet point is a "
    "different insight consisting of a single sentence.\n"
    "- [References] For each insight, you should refer to the relevant articles by using the IDs "
    "given in the article list. For example: \"Increased demand for vaccines may strain already "
    "fragile supply chains [1][4]\" which means that the insight is supported by Document 1 and "
    "Document 4. No need to say \"Article 14\", you can just use the following structure: \"[14]\".\n"
    "- [Length] Your summary should be no longer than 300 words in total."
)


# --------------------------------------------------------------------------- built in LiC's code

# tasks/database/task_database.py, populate_concat_prompt: the user query of the concat views.
DATABASE_CONCAT_HEADER = "Consider all the following:\n"
# tasks/code/task_code.py, get_formatting_preamble and _populate_fully_specific_prompt_humaneval.
LCB_FORMATTING_PREAMBLE = ("You will use the following starter code to write the solution to the problem and "
                           "enclose your code within delimiters.")
LCB_NO_STARTER = "# YOUR CODE HERE"
HUMANEVAL_INSTRUCTION = "Complete the following incomplete function signature:\n```python\n[[PROMPT]]\n```"
# tasks/translation/task_translation.py, populate_concat_prompt and populate_sharded_prompt.
TRANSLATION_CONCAT_HEADER = ("Please translate the different chunks of the following German document into English. "
                             "Translate the entire document without keeping chunking information.\n\n")
TRANSLATION_CONCAT_CHUNK = "Document Chunk [[K]]:\n[[CHUNK]]\n\n"
TRANSLATION_FIRST = (
    "You are translating a document from German to English that is being transcribed live. I will provide you "
    "with the document in chunks. At each turn, you should return the translation of the ENTIRE DOCUMENT (and not "
    "just the last chunk). You should consider all chunks together when translating, and not just the last chunk. "
    "You can optionally modify previously translated chunks if you think you had made mistakes.\n\nChunk 1:\n\n"
    "[[CHUNK]]")
TRANSLATION_NEXT = ("I have received the latest chunk of the document. Please translate the entire document so "
                    "far.\n\nChunk [[K]]:\n\n[[CHUNK]]")
# tasks/data2text/task_data2text.py, populate_fully_specific_prompt and populate_concat_prompt.
DATA2TEXT_CONTEXT_LINE = "[[KEY]]: [[VALUE]]\n"
DATA2TEXT_HINT = "Hint [[SHARD_ID]]:\n[[SHARD]]\n\n"
# tasks/summary/task_summary.py, populate_*_prompt.
SUMMARY_DOCUMENT = "Document [[INDEX]]:\n[[TEXT]]\n\n"
SUMMARY_CONCAT_HEADER = ("The documents were received in multiple chunks, you can disregard the chunking "
                         "information, and consider all documents equally.")
SUMMARY_CONCAT_CHUNK = "Document Chunk [[K]]:\n"
SUMMARY_NEXT = ("I have found a few additional documents, please rewrite the summary considering all documents so "
                "far (from before, and the new ones).\n\n[[DOCUMENTS]]")
def fill(template: str, **values: str) -> str:
    """`template` with each `[[NAME]]` replaced by `values[NAME]`, one name after the other (LiC's
    chained `str.replace`)."""
    for name, value in values.items():
        template = template.replace(f"[[{name}]]", value)
    return template
