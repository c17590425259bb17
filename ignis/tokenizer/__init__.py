"""ignis.tokenizer: exact byte-level BPE (Hugging Face tokenizers semantics), special tokens,
a streaming detokenizer, chat templates, and tokenizer files rebuilt from GGUF metadata."""
from ignis.tokenizer.chat import render_chat_template
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
