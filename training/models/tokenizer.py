"""A byte-level BPE tokenizer trained locally on rendered SQLEnv conversations, with Qwen3's chat format.

The built-in tiny model has no pretrained tokenizer to borrow (nothing is downloaded), so it gets one trained
here, in seconds, on the text it will actually read and write: the rendered oracle conversations (system prompt,
tool schemas, questions, table and column names, SQL, observations, answers). It speaks Qwen3's format exactly:
the same special tokens and TRL's own Qwen3 chat template, so TRL recognises the template, swaps in its training
variant and parses tool calls from what the model generates.

Two choices make a small model learn faster here:

- **Copy-friendly pre-tokenization.** A literal value is split the same way wherever it appears, so the
  question's `Gil Novak`, the SQL's `name = 'Gil Novak'`, the result row and the answer hold the same token ids
  (`Gil `, `Novak`), and the model learns "copy these tokens" once instead of a mapping between `" Novak"` and
  `"Novak"` for every value. Words carry no leading space (a value's first word follows a space in the
  question but a quote in SQL); a word keeps the single space that joins it to a capitalised next word, so a
  multi-word name copies token by token (after `Gil ` comes `Novak`: a plain induction lookup, where a
  separate space token would leave the model to look two tokens back); numbers go in runs of up to three
  digits, so `1099` is `109`, `9` everywhere.
- **Boilerplate phrases.** Lines that recur in most conversations (the system prompt, the tool schemas, Qwen3's
  tool header) become single added tokens, so the fixed prompt costs tens of tokens instead of hundreds: shorter
  sequences train and generate faster and dilute the small model's attention less.
"""

from __future__ import annotations

import collections
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Qwen3's tokens that the template and TRL's parser rely on. The first three are special (skipped when
#: decoding with skip_special_tokens=True); the rest are plain added tokens, as in Qwen3's own tokenizer.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# A letter run (with `_`, so identifiers stay whole) with the one space before a capitalised word; a letter run;
# up to three digits; whitespace; a single quote on its own (so the quote that closes an SQL string never fuses
# with what follows); other punctuation runs. See the module docstring for why.
PRETOKENIZE_PATTERN = r"[\p{L}\p{M}_]+ (?=\p{Lu})|[\p{L}\p{M}_]+|\p{N}{1,3}|\s+|'|[^\s\p{L}\p{M}\p{N}_']+"


def qwen3_chat_template() -> str:
    """TRL's Qwen3 chat template, read from the installed TRL so that TRL recognises it byte for byte."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")


def render_conversations(conversations: Iterable[dict], chat_template: str | None = None) -> list[str]:
    """Render `{"messages": [...], "tools": [...]}` conversations to text with the Qwen3 training template.

    The training variant is what TRL uses in GRPO (Qwen3's own template is not prefix-preserving) and in SFT, so
    this is the exact text the model will be trained on.
    """
    from transformers.utils.chat_template_utils import render_jinja_template
    from trl.chat_template_utils import qwen3_training_chat_template

    texts = []
    for conv in conversations:
        tools = conv.get("tools")
        if isinstance(tools, str):
            tools = json.loads(tools)
        rendered, _ = render_jinja_template(
            [conv["messages"]], tools=tools or None, chat_template=chat_template or qwen3_training_chat_template
        )
        texts.append(rendered[0])
    return texts


def find_phrases(
    texts: Sequence[str], *, min_fraction: float = 0.5, prefix_fraction: float = 0.02, min_chars: int = 12
) -> list[str]:
    """The boilerplate of a corpus, to be added as whole tokens. Sorted, so the result is deterministic.

    - Lines that occur in at least `min_fraction` of the texts (system prompt, tool schemas, template text).
    - Line prefixes that end where a JSON string value starts (`...": "`) and occur in at least
      `prefix_fraction` of the texts: the head of each tool call, e.g. `{"name": "query", "arguments": {"sql": "`,
      so choosing a tool and its argument is one token for the model.

    - The longest run of text that starts every text's first segment (between special tokens): the whole
      system turn (system prompt, Qwen3's tool header, every tool schema) becomes one token.

    All need `min_chars` or more. Special and added tokens are cut out first, so a phrase never contains one
    (TRL finds turn boundaries by the `<|im_end|>` token, so it must stay a token of its own).
    """
    lines: collections.Counter[str] = collections.Counter()
    prefixes: collections.Counter[str] = collections.Counter()
    shared: str | None = None
    for text in texts:
        segments = _split_on_added_tokens(text)
        if segments:
            first = max(segments[:2], key=len)  # the system turn's text, after `<|im_start|>`
            shared = first if shared is None else os.path.commonprefix([shared, first])
        text = "\n".join(segments)
        seen_lines = {line for line in text.split("\n") if len(line.strip()) >= min_chars}
        lines.update(seen_lines)
        seen_prefixes = set()
        for line in seen_lines:
            end = line.find('": "')
            while end != -1:
                if end + 4 >= min_chars:
                    seen_prefixes.add(line[: end + 4])
                end = line.find('": "', end + 1)
        prefixes.update(seen_prefixes)
    line_threshold = max(2, int(min_fraction * len(texts)))
    prefix_threshold = max(2, int(prefix_fraction * len(texts)))
    found = {line for line, n in lines.items() if n >= line_threshold}
    found |= {p for p, n in prefixes.items() if n >= prefix_threshold and p not in found}
    # Prefixes of kept lines are never used (the longest match wins), so drop them.
    found = {p for p in found if not any(q != p and q.startswith(p) for q in found)}
    if shared and len(texts) >= 2 and len(shared.strip()) >= min_chars:
        found.add(shared)
    return sorted(found)


def _split_on_added_tokens(text: str) -> list[str]:
    pattern = "|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS)
    return [segment for segment in re.split(pattern, text) if segment]


def train_tokenizer(
    texts: Sequence[str],
    *,
    vocab_size: int = 2048,
    min_frequency: int = 2,
    phrases: Sequence[str] | None = None,
    chat_template: str | None = None,
):
    """Train a byte-level BPE tokenizer on `texts` and wrap it as a transformers tokenizer in Qwen3's format.

    Args:
        texts: the training corpus, usually `render_conversations(...)` of oracle episodes.
        vocab_size: BPE vocabulary size (special tokens and phrases come on top). 2048 keeps the embedding
            table small for a ~2M-parameter model while still giving whole tokens to common words and SQL.
        min_frequency: a merge must be seen this often.
        phrases: whole lines to add as single tokens; defaults to `find_phrases(texts)`.
        chat_template: defaults to TRL's Qwen3 template (`qwen3_chat_template()`).

    Returns:
        a `PreTrainedTokenizerFast` with eos `<|im_end|>`, pad `<|endoftext|>` and the chat template set.
        Deterministic: the same texts give the same vocabulary.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if phrases is None:
        phrases = find_phrases(texts)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(texts), trainer=trainer)
    bpe.add_tokens([AddedToken(t, normalized=False, special=False) for t in ADDED_TOKENS])
    bpe.add_tokens([AddedToken(p, normalized=False, special=False) for p in phrases])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template or qwen3_chat_template()
    return tokenizer
