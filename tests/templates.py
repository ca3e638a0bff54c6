"""Chat templates the tests render with: real ones (Llama 3, Qwen 2.5, Qwen 3) and broken ones,
each a way a template can go wrong."""

# Llama 3 ends each header with "\n\n". Its own tokenizer splits that off as one token
# whatever follows, but SmolLM2's GPT-2-style pre-tokenizer makes one token of "\n\n" at the
# end of the generation prompt and two when text follows: a real token-boundary break,
# tested below. The template used for the mask tests ends headers with one "\n".
LLAMA3_REAL = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA3 = LLAMA3_REAL.replace("<|end_header_id|>\\n\\n", "<|end_header_id|>\\n")

QWEN25 = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen3-style: assistant turns before the last user message lose their <think> block.
QWEN3_THINK = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Writes how many messages there are into the system prompt, like a date that changes.
COUNTING = (
    "{{- '<|im_start|>system\\nConversation of ' + messages | length | string + ' messages<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The generation prompt opens an empty think block that rendered assistant turns lack.
THINK_PROMPT = QWEN25.replace("{{- '<|im_start|>assistant\\n' }}",
                              "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}")

# Assistant turns end with a blank line instead of an end-of-turn token.
NO_END_OF_TURN = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' + message['content'] + '\\n\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Renders an assistant message as its header only, dropping the content.
DROPS_ASSISTANT = (
    "{%- for message in messages %}{%- if message['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
