"""Lost in Conversation's prompts of the user simulator and of the classifier, verbatim, for
`prompts: lic` (`fic.conversation.users`, `fic.conversation.classify`).

Reproduced as data from microsoft/lost_in_conversation (commit ba6b9a2, files under `prompts/`
as named above each constant; the answer descriptions come from each task's Python code). The
`[[NAME]]` slots are LiC's, filled by `fic.tasks.lic_prompts.fill`.

Lost in Conversation is released under the MIT License, reproduced in `fic.tasks.lic_prompts`.
"""

# prompts/system_turn_categorization.txt
CLASSIFIER = (
    "You are reviewing a multi-turn conversation between a user and an assistant, and are given the "
    "last turn of the conversation.\n"
    "\n"
    "Here is the full specification of the problem the system is attempting to solve:\n"
    "[[INITIAL_SHARD]]\n"
    "\n"
    "Specification:\n"
    "[[SHARDS]]\n"
    "\n"
    "You must classify the response of the assistant according to the response type:\n"
    "- `answer_attempt`: The response contains a complete answer attempt to the user's question (not "
    "templated or hypothetical), that can be extracted verbatim. See the task-specific answer "
    "description for more details.\n"
    "- `clarification`: The response  is short (less than 100 words) and contains a single question "
    "addressed to the user that directly inquires about an aspect of the user's query. A "
    "clarification turn cannot be long (see `discussion`), cannot contain a vague question (see "
    "`discussion`) and cannot contain multiple questions (see `interrogation`).\n"
    "- `interrogation`: The response contains multiple questions addressed to the user, sometimes "
    "organized in a list or bullet-points.\n"
    "- `discussion`: The response discusses the question in detail, without providing a final "
    "answer, asking a specific clarification question, or a refusal to answer. The response may or "
    "may not contain a vague question (e.g., “What else can I help you with?”).\n"
    "- `hedge`: The response contains multiple answer candidates based on hypotheticals (ifs) or "
    "branching (case 1, case 2) with corresponding descriptions.\n"
    "- `refuse`: The response contains an explicit or implicit refusal to answer the user's question "
    "without a follow-up question or a request.\n"
    "- `missing`: The response is empty/blank.\n"
    "\n"
    "You must output your answer in the following JSON format:\n"
    "{\"response_type\": \"refuse|missing|answer_attempt|hedge|clarification|interrogation|discussion\"}\n"
    "\n"
    "Rules:\n"
    "- The assistant giving a hint at how an answer could look like is not a final answer. You "
    "should only select `answer_attempt` if the conversation could end at this stage with the user "
    "having an entirely final answer to the problem they've formulated.\n"
    "- [Task Specific Answer] [[ANSWER_DESCRIPTION]]\n"
    "\n"
    "Conversation's last turn:\n"
    "[[CONVERSATION_SO_FAR]]"
)

# prompts/user_agent.txt
USER_AGENT = (
    "You are simulating a user of an interactive LLM system (like ChatGPT).\n"
    "The user is inherently lazy, and answers in short form, providing only minimal information to "
    "the system. You should not be proactive.\n"
    "\n"
    "Here's the conversation so far:\n"
    "[[CONVERSATION_SO_FAR]]\n"
    "\n"
    "Here are the shards that have already been revealed:\n"
    "[[SHARDS_REVEALED]]\n"
    "\n"
    "Here are all the shards that have not been revealed yet:\n"
    "[[SHARDS_NOT_REVEALED]]\n"
    "\n"
    "You must generate a response to the conversation so far. Here are the rules:\n"
    "- [Providing a Shard] You can reveal the content of a shard to the system in your response if "
    "it will help the system move closer to answering the problem. You should select the shard to "
    "reveal that is most \"basic\" and is the current most relevant shard.\n"
    "- [One Shard at a Time] You should only reveal at most one shard at a time.\n"
    "- [Reveal Entire Shard] If you reveal a shard, you must make sure to include *all the "
    "information in the shard*. For example, if the shard is \"your symptoms are that you have a "
    "headache in the mornings\", your response can't just be ``yeah I have headaches'', you must say "
    "``yup mostly headaches in the mornings``.\n"
    "- [Irrelevant Clarifications] If the system asks you a question irrelevant to the shards, asks "
    "you a generic question (``Can you give me a hint?``), you should respond with an answer that "
    "does not provide a shard. (``I don't know``, ``Is that really important?``, etc.) You should "
    "not reveal any information beyond what is available in the shards.\n"
    "- [No Repeated Shards] You should not reveal the same shard more than once. Carefully review "
    "the shards revealed already, and only reveal a shard if its `shard_id` is not on the list.\n"
    "- [Rephrase Shards] If you reveal a shard, you should rephrase it in a conversational way. Do "
    "not copy the shard verbatim.\n"
    "- [Do Not Ask Questions] Your response should always be declarative sentences, and not "
    "questions.\n"
    "- [Brevity of Response] You should favor being succint. Your answer can also have typos, "
    "improper grammar, capitalization, etc. You are simulating a real person talking to an AI, who "
    "is in a hurry.\n"
    "- [Format] Your response should be formatted as a JSON object with the following keys:\n"
    "    - `response`: The response to the conversation so far.\n"
    "    - `shard_id`: The shard you are revealing to the system. The shard_id can be an integer, or "
    "-1 if you did not reveal any shards.\n"
    "For example:\n"
    "{\"response\": \"I don't know\", \"shard_id\": -1}\n"
    "or:\n"
    "{\"response\": \"yeah I want it to [...]\", \"shard_id\": 1}"
)

# Each task's get_answer_description (tasks/*/task_*.py), for the classifier's [[ANSWER_DESCRIPTION]].
ANSWER_DESCRIPTIONS = {
    "math": "The answer should be a single number (it could be decimal, or negative, or a fraction, etc.).",
    "database": ("If the response contains a complete SQL query (and not just partial or templated SQL used as an "
                 "example), then it is an answer attempt. You must only extract the SQL query, nothing before or "
                 "after, as it will be executed as is."),
    "actions": ("The answer should be a series of valid function calls in the format of "
                "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]. "
                "An answer may contain multiple function calls."),
    "code": ("A final answer must be a valid Python function that is defined (def ...) and returns something. The "
             "function should handle multiple test cases according to the problem specification. If the answer is "
             "just a natural language explanation, it is not a valid answer. Special symbols like newlines and "
             "quotes must be escaped."),
    "translation": "A complete English translation of the German text.",
    "data2text": "A one-sentence description of the table.",
    "summary": "A complete summary potentially containing multiple lines, and citation.",
}
