"""The rule classifier against hand-labelled replies, per task with a rule classifier.

Each row: the user's turns so far, the assistant's reply, and the label a careful reader gives it
under Lost in Conversation's definitions (an `answer_attempt` only when the conversation could
end there with the user holding a final answer). The rows cover what small models say in
sharded conversations: recaps of what the user said (across several messages), intermediate
results followed by a request for more, templates and examples, questions of every kind, and
the answers, with and without a courtesy question, that must stay answer attempts.

The rows before "Written after the classifier" in each table were written with the fix; the
eight after it were written once the fix was done and labelled before running it (it agreed on
28 of those 32; two failure modes they showed, recaps in other words and "Anything else about
X?" taken for a specific question, were then fixed).
"""

from __future__ import annotations

import pytest

from fic import tasks
from fic.conversation.labels import reply_label

# --------------------------------------------------------------------------- math

ARA = ["How many points did Ara score in total?", "Ara played for 4 years.", "She played 40 games every year.",
       "She scored 21 points in each game."]
ARA1, ARA2, ARA3, ARA4 = ARA[:1], ARA[:2], ARA[:3], ARA
PENS = ["How much did Tom spend?", "Tom bought 3 pens.", "Each pen cost $2."]
MIA = ["How many apples does Mia have left?", "Mia had 12 apples.", "She gave 5 to Leo."]

MATH = [
    # Recaps and partial results (issue 19, item 8, the first three).
    (ARA3, "Got it: 4 years and 40 games per year.", "discussion"),
    (ARA3, "So far: 4 years and 40 games per year, so 160 games in total. How many points per game?",
     "clarification"),
    (ARA3, "Okay, so she played 4 * 40 = 160 games. What else?", "discussion"),
    (ARA2, "Ara played for 4 years.", "discussion"),
    (ARA3, "So Ara played 4 years, with 40 games each year.", "discussion"),
    (ARA3, "Noted: 40 games every year for 4 years.", "discussion"),
    (ARA3, "Thanks! So she played 40 games a year for 4 years. How many points did she score per game?",
     "clarification"),
    (ARA3, "That makes 4 * 40 = 160 games. I still need the points per game to find the total.", "clarification"),
    (ARA3, "160 games so far. Please tell me how many points she scored in each game.", "clarification"),
    (ARA3, "Ara played 4 years at 40 games a year. Once you tell me her points per game, I can work out the total.",
     "discussion"),
    (ARA3, "So she played 160 games. Please go on.", "discussion"),
    (ARA3, "4 * 40 = 160 games. What's the next detail?", "discussion"),
    (PENS[:2], "Tom bought 3 pens. How much did each pen cost?", "clarification"),
    (PENS, "So Tom bought 3 pens at $2 each.", "discussion"),
    # Answers, with or without a courtesy question: still answer attempts.
    (ARA4, "4 * 40 = 160 games, and 160 * 21 = 3360 points.", "answer_attempt"),
    (ARA4, "She scored 3360 points in total. Anything else?", "answer_attempt"),
    (ARA4, "So the total is 4 * 40 * 21 = 3360 points. Does that help?", "answer_attempt"),
    (ARA4, "So 4 * 40 = 160 games, and 160 * 21 = 3360. Is there anything else you would like me to calculate?",
     "answer_attempt"),
    (ARA4, "Got it. Over 160 games at 21 points each, she scored 3360 points. Let me know if you need anything else!",
     "answer_attempt"),
    (ARA4, "Let me recap: 4 years, 40 games a year, 21 points a game. So she scored 3360 points.", "answer_attempt"),
    (ARA4, "Okay, 21 points in each game. So 160 * 21 = 3360 points. Is that what you were looking for?",
     "answer_attempt"),
    (ARA4, "The answer is 3360. Would you like me to walk through the steps?", "answer_attempt"),
    (ARA4, "Total: 3360 points. Want me to break it down by year?", "answer_attempt"),
    (ARA4, "Ara scored 3360 points over the four years.\n#### 3360", "answer_attempt"),
    (ARA3, "She played 160 games in total.", "answer_attempt"),  # a (wrong) committed answer
    (PENS, "Tom spent 3 * $2 = $6.", "answer_attempt"),
    # Questions, hedges, refusals, nothing.
    (ARA1, "How many years did Ara play?", "clarification"),
    (ARA1, "How many years did she play? And how many games each year?", "interrogation"),
    (ARA1, "What else should I know?", "discussion"),
    (ARA4, "It depends on the games she missed: at 40 games a year it is 3360, at 38 it is 3192.", "hedge"),
    (ARA4, "I'm sorry, but I can't help with that.", "refuse"),
    (ARA4, "", "missing"),
    # Written after the classifier, before it was tuned on them (see the module docstring).
    (MIA[:2], "Okay, Mia starts with 12 apples.", "discussion"),
    (MIA, "Mia had 12 apples and gave 5 to Leo, so she has 12 - 5 = 7 apples left.", "answer_attempt"),
    (MIA, "12 - 5 = 7. Is there anything else you need?", "answer_attempt"),
    (MIA[:2], "She has 12 apples for now. Did she give any away?", "clarification"),
    (MIA, "Right, so 12 apples and 5 given to Leo.", "discussion"),
    (MIA, "Mia has 7 apples left. Hope that helps!", "answer_attempt"),
    (MIA[:2], "Got it. What happened to the apples next?", "clarification"),
    (MIA, "First, she had 12 apples. Then she gave away 5. I'll subtract next.", "discussion"),
]

# --------------------------------------------------------------------------- actions

FLIGHT = ["I want to book a flight.", "I'm flying from Paris.", "To Tokyo.", "On 2025-03-14."]
FL1, FL2, FL3, FL4 = FLIGHT[:1], FLIGHT[:2], FLIGHT[:3], FLIGHT
CALL = '[book_flight(origin="Paris", destination="Tokyo", date="2025-03-14")]'
ALARM = ["Set an alarm for me.", "At 07:30.", "Label it gym."]

ACTIONS = [
    (FL3, "Got it: a flight from Paris to Tokyo.", "discussion"),
    (FL3, "Okay, Paris to Tokyo. What date do you want to fly?", "clarification"),
    (FL3, "So far I have origin Paris and destination Tokyo. What else?", "discussion"),
    (FL3, 'Once you tell me the date, I will call [book_flight(origin="Paris", destination="Tokyo", date="<date>")].',
     "discussion"),
    (FL3, '[book_flight(origin="Paris", destination="Tokyo", date="YYYY-MM-DD")]\nWhich date should I use?',
     "clarification"),
    (FL3, 'The call would look like this: [book_flight(origin="Paris", destination="Tokyo", date=...)]. '
          "What is the travel date?", "clarification"),
    (FL3, 'You could call book_flight(origin="Paris", destination="Tokyo") once you know the date.', "discussion"),
    (FL3, 'For example: book_flight(origin="Paris", destination="Tokyo", date="2025-01-01"). Which date do you need?',
     "clarification"),
    (FL3, 'I will call book_flight(origin="Paris", destination="Tokyo", date=date) when you tell me the date.',
     "discussion"),
    (FL3, "To book this I need the travel date. Could you tell me the date?", "clarification"),
    (FL3, "So you want to fly from Paris to Tokyo. Should I use book_flight for that?", "clarification"),
    # Calls made: answer attempts, early or not.
    (FL4, CALL, "answer_attempt"),
    (FL4, f"Here is the call: {CALL}", "answer_attempt"),
    (FL4, f"Sure! {CALL} Anything else?", "answer_attempt"),
    (FL4, '```python\nbook_flight(origin="Paris", destination="Tokyo", date="2025-03-14")\n```', "answer_attempt"),
    (FL2, '[book_flight(origin="Paris")]', "answer_attempt"),
    (FL3, 'Calling it now: [book_flight(origin="Paris", destination="Tokyo")]', "answer_attempt"),
    (FL4, f"Booking your flight from Paris to Tokyo on 2025-03-14:\n{CALL}\nLet me know if you need a hotel too!",
     "answer_attempt"),
    (FL4, f"{CALL}\nWould you like me to add a return flight?", "answer_attempt"),
    # Questions, talk, refusals, nothing.
    (FL1, "Where are you flying from? And where to?", "interrogation"),
    (FL1, "Sure, which city are you departing from?", "clarification"),
    (FL1, "What else do I need to know?", "discussion"),
    (FL1, "Got it. Please share the remaining details.", "discussion"),
    (FL4, "Let me think about the request. " * 20 + "Which date?", "discussion"),
    (FL4, "I can't help with booking flights.", "refuse"),
    (FL4, "", "missing"),
    # Written after the classifier, before it was tuned on them.
    (ALARM[:2], "Sure, an alarm at 07:30. What label should it have?", "clarification"),
    (ALARM, '[set_alarm(time="07:30", label="gym")]', "answer_attempt"),
    (ALARM, 'Done: set_alarm(time="07:30", label="gym")', "answer_attempt"),
    (ALARM[:2], 'I can set it with set_alarm(time="07:30", label=...). What label?', "clarification"),
    (ALARM[:2], "Alarm at 07:30 noted. Anything else for the alarm?", "discussion"),
    (ALARM, '```\n[set_alarm(time="07:30", label="gym")]\n```\nYour alarm is set.', "answer_attempt"),
    (ALARM[:1], "What time should the alarm go off, and should it repeat?", "clarification"),
    (ALARM, "I'm unable to set alarms.", "refuse"),
]

# --------------------------------------------------------------------------- code

SPEC = ["I need a Python function `by_length(arr)`.", "It should sort the integers between 1 and 9.",
        "Then reverse the list.", "And replace each digit by its name."]
CD1, CD2, CD3, CD4 = SPEC[:1], SPEC[:2], SPEC[:3], SPEC
PAL = ["Write `is_palindrome(s)`.", "Ignore case.", "Ignore spaces too."]
SOLUTION = ("```python\ndef by_length(arr):\n"
            "    names = ['One', 'Two', 'Three', 'Four', 'Five', 'Six', 'Seven', 'Eight', 'Nine']\n"
            "    kept = sorted(x for x in arr if 1 <= x <= 9)\n"
            "    return [names[x - 1] for x in reversed(kept)]\n```")

CODE = [
    (CD2, "Got it: `by_length(arr)` should sort the integers between 1 and 9.", "discussion"),
    (CD2, "So by_length(arr) sorts the integers between 1 and 9. What should happen to the other numbers?",
     "clarification"),
    (CD2, "Here's the signature:\n```python\ndef by_length(arr):\n    pass\n```\nWhat should it return?",
     "clarification"),
    (CD2, 'A skeleton to start from:\n```python\ndef by_length(arr):\n    """Sort, reverse, name."""\n    ...\n```',
     "discussion"),
    (CD3, "```python\ndef by_length(arr):\n    raise NotImplementedError\n```\nI'll fill it in once you tell me the "
          "last step.", "discussion"),
    (CD2, "For example, the function could look like this:\n```python\ndef by_length(arr):\n    return sorted(arr)\n```"
          "\nDoes the order matter?", "clarification"),
    (CD3, "Once you confirm the last step, the code will be:\n```python\ndef by_length(arr):\n"
          "    return sorted(arr)\n```", "discussion"),
    # Code written: answer attempts, early or not, with or without a question after it.
    (CD4, SOLUTION, "answer_attempt"),
    (CD4, SOLUTION + "\nLet me know if you want tests too!", "answer_attempt"),
    (CD4, SOLUTION + "\nShould it also handle an empty list?", "answer_attempt"),
    (CD4, "Here is a first version:\n```python\ndef by_length(arr):\n    return arr\n```", "answer_attempt"),
    (CD2, "Based on what you said so far:\n```python\ndef by_length(arr):\n"
          "    return sorted(x for x in arr if 1 <= x <= 9)\n```", "answer_attempt"),
    (CD4, "def by_length(arr):\n    return sorted(arr, reverse=True)", "answer_attempt"),
    (CD4, "```python\ndef by_length(arr):\n    # TODO: handle negatives\n    return sorted(arr)[::-1]\n```",
     "answer_attempt"),
    # Questions, talk, refusals, nothing.
    (CD1, "What should the function do with the integers?", "clarification"),
    (CD1, "What should it return? And what about numbers outside 1-9?", "interrogation"),
    (CD1, "What else should the function take into account?", "discussion"),
    (CD3, "Thanks. Please share the remaining requirements.", "discussion"),
    (CD2, "I will sort the list and then map digits to names.", "discussion"),
    (CD4, "You can use the `sorted()` function with `reverse=True` for that.", "discussion"),
    (CD3, "Let me explain my plan. " * 25 + "Should names be capitalised?", "discussion"),
    (CD4, "I'm sorry, but I can't help with that.", "refuse"),
    (CD4, "", "missing"),
    # Written after the classifier, before it was tuned on them.
    (PAL[:2], "Sure. So it should ignore case. Anything about spaces or punctuation?", "clarification"),
    (PAL, "```python\ndef is_palindrome(s):\n    t = s.replace(' ', '').lower()\n    return t == t[::-1]\n```",
     "answer_attempt"),
    (PAL, "```python\ndef is_palindrome(s: str) -> bool:\n    ...\n```\nShould empty strings count as palindromes?",
     "clarification"),
    (PAL[:2], "Here's what I have so far:\n```python\ndef is_palindrome(s):\n    s = s.lower()\n    return s == s[::-1]\n```"
              "\nAnything else it should ignore?", "answer_attempt"),
    (PAL[:1], "I'd reverse the string and compare. Should it be case-sensitive?", "clarification"),
    (PAL, "The function would be something like:\n```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```",
     "discussion"),
    (PAL, "```python\nclass Solution:\n    def isPalindrome(self, s):\n        return s == s[::-1]\n```", "answer_attempt"),
    (PAL[:2], "Noted: ignore case.", "discussion"),
]

# --------------------------------------------------------------------------- database

ASK = ["I need the names of singers.", "Only singers from France.", "Sorted by age."]
DB1, DB2, DB3 = ASK[:1], ASK[:2], ASK
QUERY = "```sql\nSELECT name FROM singer WHERE country = 'France' ORDER BY age\n```"
CONCERTS = ["How many concerts were held?", "Only in 2014."]

DATABASE = [
    (DB2, "Got it: the names of singers from France.", "discussion"),
    (DB2, "So you need singer names from France. Should they be sorted?", "clarification"),
    (DB2, "Select the columns you need and I'll write the query.", "discussion"),
    (DB2, "```sql\nSELECT name FROM singer WHERE country = ?\n```\nWhich country should I filter on?", "clarification"),
    (DB2, "The query would look like this:\n```sql\nSELECT name FROM singer WHERE country = '<country>'\n```",
     "discussion"),
    (DB2, "```sql\nSELECT name FROM singer WHERE ...\n```\nWhat condition should I add?", "clarification"),
    (DB2, "For example:\n```sql\nSELECT column_name FROM table_name\n```", "discussion"),
    (DB2, "Once you tell me the sort order, the query will be:\n" + QUERY, "discussion"),
    (DB2, "Noted. Please tell me how the results should be sorted.", "clarification"),
    # Queries written: answer attempts, early or not.
    (DB3, QUERY, "answer_attempt"),
    (DB3, "SELECT name FROM singer WHERE country = 'France' ORDER BY age;", "answer_attempt"),
    (DB3, "Here is the query:\n" + QUERY + "\nDo you want it in descending order instead?", "answer_attempt"),
    (DB2, "Here is a query for what you described so far:\n```sql\nSELECT name FROM singer WHERE country = 'France'\n```",
     "answer_attempt"),
    (DB1, "This should do it:\n```sql\nSELECT count(*) FROM singer\n```", "answer_attempt"),
    (DB3, "```sql\nSELECT name FROM singer WHERE country = 'France' AND name LIKE 'A%' ORDER BY age\n```\nAnything else?",
     "answer_attempt"),
    (DB3, "```sql\nSELECT name FROM singer WHERE country = 'France' AND age < 40 AND age > 20 ORDER BY age\n```",
     "answer_attempt"),
    # Questions, talk, refusals, nothing.
    (DB1, "Which singers do you want: from which country?", "clarification"),
    (DB1, "Which columns do you need? And should I sort them?", "interrogation"),
    (DB1, "What else should the query take into account?", "discussion"),
    (DB1, "I'll look at the singer table and pick the name column.", "discussion"),
    (DB2, "Let me think about the schema. " * 25 + "Which table holds the ages?", "discussion"),
    (DB3, "I'm sorry, but I can't help with that.", "refuse"),
    (DB3, "", "missing"),
    # Written after the classifier, before it was tuned on them.
    (CONCERTS[:1], "Do you want all concerts or a specific year?", "clarification"),
    (CONCERTS, "```sql\nSELECT count(*) FROM concert WHERE year = 2014\n```", "answer_attempt"),
    (CONCERTS, "SELECT COUNT(*) FROM concert WHERE Year = '2014'", "answer_attempt"),
    (CONCERTS[:1], "```sql\nSELECT count(*) FROM concert WHERE year = <year>\n```\nWhich year?", "clarification"),
    (CONCERTS, "So: concerts held in 2014.", "discussion"),
    (CONCERTS, "I would write something like `SELECT count(*) FROM concert`, but which table has the year?",
     "clarification"),
    (CONCERTS, "WITH c AS (SELECT * FROM concert WHERE year = 2014) SELECT count(*) FROM c", "answer_attempt"),
    (CONCERTS[:1], "Sure! Which stadiums should I consider? Any particular year?", "interrogation"),
]

HAND_LABELLED = {"math": MATH, "actions": ACTIONS, "code": CODE, "database": DATABASE}


def agreement(task_name: str) -> tuple[int, int]:
    """(rows the task's rule classifier labels as the hand label, rows) for one task."""
    task = tasks.get(task_name)
    rows = HAND_LABELLED[task_name]
    return sum(reply_label(task, reply, said) == label for said, reply, label in rows), len(rows)


def test_every_task_with_a_rule_classifier_has_twenty_hand_labelled_replies():
    for name, rows in HAND_LABELLED.items():
        assert len(rows) >= 20, name
        assert sum(label == "answer_attempt" for _, _, label in rows) >= 6, name  # answers must stay answers
        assert len({label for _, _, label in rows}) >= 5, name


@pytest.mark.parametrize("task_name, said, reply, label", [
    (name, said, reply, label) for name, rows in HAND_LABELLED.items() for said, reply, label in rows])
def test_rule_label_matches_the_hand_label(task_name, said, reply, label):
    assert reply_label(tasks.get(task_name), reply, said) == label


@pytest.mark.parametrize("task_name", sorted(HAND_LABELLED))
def test_the_sft_corpus_waiting_replies_are_never_answer_attempts(task_name):
    # What the warm-start corpus says while details are missing must not count as answering.
    task = tasks.get(task_name)
    for reply in (*task.deferrals, *task.generic_asks):
        assert reply_label(task, reply, ["Some detail."]) != "answer_attempt", reply
