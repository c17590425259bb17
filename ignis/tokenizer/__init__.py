"""ignis.tokenizer: exact BPE with Hugging Face tokenizers semantics, byte-level (bpe.py) and
SentencePiece-style with byte fallback (spm_bpe.py), special tokens, decoders and a streaming
detokenizer, chat templates, tokenizer files rebuilt from GGUF metadata, and a cache of compiled
tokenizers under IGNIS_HOME/tokenizers (ignis.tokenizer.compiled) for fast loads."""
from ignis.tokenizer.errors import (ChatTemplateError, GGUFTokenizerError, TokenIdError,
                                    TokenizerError, TokenizerFormatError, TokenizerInputError,
                                    UnsupportedTokenizerError)
from ignis.tokenizer.gguf_vocab import tokenizer_files_from_gguf
from ignis.tokenizer.stream import StreamDecoder
from ignis.tokenizer.tokenizer import AddedToken, Tokenizer, load_tokenizer

__all__ = [
    "AddedToken", "ChatTemplateError", "GGUFTokenizerError", "StreamDecoder", "TokenIdError",
    "Tokenizer", "TokenizerError", "TokenizerFormatError", "TokenizerInputError",
    "UnsupportedTokenizerError", "load_tokenizer", "render_chat_template", "tokenizer_files_from_gguf",
]


def __getattr__(name: str):
    # Chat templates need jinja2 (tens of ms to import): load it only when a template is rendered.
    if name == "render_chat_template":
        from ignis.tokenizer.chat import render_chat_template
        return render_chat_template
    raise AttributeError(f"module 'ignis.tokenizer' has no attribute {name!r}")
