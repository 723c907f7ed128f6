"""Real Hugging Face tokenizer directories, built offline in a test (shared test helper).

:func:`build_tokenizer_dir` trains a small byte-level BPE with the ``tokenizers`` library on a
fixed text, adds Llama-3-like special tokens, and saves it with ``transformers``'
``PreTrainedTokenizerFast`` (``tokenizer.json`` + ``tokenizer_config.json`` with a
``chat_template``), so ``AutoTokenizer.from_pretrained(dir)`` loads it as it loads a model's
tokenizer. Templates:

- ``LLAMA3_GENERATION``: Llama-3-like, assistant turns wrapped in ``{% generation %}`` (what
  ``return_assistant_tokens_mask`` reads);
- ``LLAMA3``: the same rendering without the tags (masks found by rendering);
- ``CHATML``: ChatML with real special tokens and no BOS, without the tags.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|im_start|>",
    "<|im_end|>",
]
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

_LLAMA3_TURN = (
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}"
    "{% endif %}"
    "{% if message['tool_calls'] is defined %}"
    "{% for call in message['tool_calls'] %}<tool>{{ call['function']['name'] }}</tool>"
    "{% endfor %}{% endif %}<|eot_id|>"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}" + _LLAMA3_TURN + "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}"
)
LLAMA3_GENERATION = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% generation %}"
    + _LLAMA3_TURN.split("<|end_header_id|>\n\n", 1)[1]
    + "{% endgeneration %}{% else %}"
    + _LLAMA3_TURN
    + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}"
)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Packages are balanced so that every rank finishes its step at the same time.",
    "What is the capital of France? The capital of France is Paris.",
    "A helpful assistant answers questions clearly and briefly.",
    "user assistant system tool function call result\n\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Symbols: ( ) [ ] { } < > / \\ | - _ = +",
] * 20


def build_tokenizer_dir(
    root: str | Path,
    template: str | None = LLAMA3_GENERATION,
    *,
    vocab_size: int = 400,
    extra_special: list[str] | None = None,
    bos: str | None = BOS,
    eos: str = EOS,
) -> Path:
    """Save a trained byte-level BPE tokenizer (special tokens above and ``extra_special``,
    ``chat_template`` ``template``, None for none; ``bos`` None: no BOS token) into ``root``;
    output: ``root``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + [t for t in extra_special or [] if t not in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    if template is not None:
        fast.chat_template = template
    root = Path(root)
    fast.save_pretrained(str(root))
    return root
