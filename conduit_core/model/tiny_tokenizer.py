"""Locally built byte-level BPE tokenizers for the builtin tiny models (no downloads).

Training is deterministic, on an embedded English text, so that ordinary words tokenize into
a few sensible pieces and a builtin's tokenizer is the same everywhere; the special tokens get
the first ids, in the order given, and are never split.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

_CORPUS = """
The annual report describes the revenue, costs and profit of the company for each quarter of
the year. Total revenue grew by twelve percent, while operating costs fell in the second half.
The invoice lists the customer name, the invoice number, the date of issue, the amount due and
the payment terms. Please pay within thirty days of the date shown on this page.
A document may contain tables, figures, charts and paragraphs of text. Each page has a number,
a title and sometimes a caption under the figure. The table on page two shows the sales by
region: north, south, east and west. Which region had the highest sales in March?
The meeting was held on Monday in the main office. The board approved the budget and the new
hiring plan. The minutes were signed by the secretary and the chair of the committee.
What is the total amount on the invoice? Who signed the contract? When was the report
published? How many employees work in the research department? Answer the question using
the pages above. If the answer is not in the document, say that you do not know.
The quick brown fox jumps over the lazy dog. A picture is worth a thousand words, but a table
of numbers tells the story of the business. The results are summarised in the final section.
Section one introduces the method; section two presents the data; section three discusses the
results and their limits. The appendix contains the full list of references and definitions.
Yes. No. The answer is one hundred and twenty. The value is 42. The date is 2024-05-17.
"""


def build_tokenizer(
    special_tokens: list[str],
    *,
    chat_template: str,
    eos_token: str,
    pad_token: str,
    vocab_size: int = 768,
    named_special: dict[str, str] | None = None,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the embedded corpus and wrap it as a fast tokenizer.

    Deterministic: the same arguments always give the same vocabulary and merges.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    extra: list[str] | dict[str, str] = named_special or [
        t for t in special_tokens if t not in (eos_token, pad_token)]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token,
        pad_token=pad_token,
        extra_special_tokens=extra,
        chat_template=chat_template,
    )
    return fast
