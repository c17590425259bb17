"""The chat section of a compiled library: which of the C renderers (csrc/native/chat.c) reproduces
a model's Jinja chat template, and the parameters it takes from the template.

The native library cannot run Jinja, so it renders a known set of template families by hand. A
template is recognised by its fingerprint: the SHA-256 of its text with the parameters a family
allows to vary (the default system prompt) cut out, after one harmless normalisation (a newline
right after the final block tag, which trim_blocks drops anyway). Anything else is refused with
UnsupportedChatTemplateError: the renderer would not be exact, and a prompt that is not the one
the model was trained on fails silently.
"""
from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from ..tokenizer.errors import ChatTemplateError

if TYPE_CHECKING:
    from ..tokenizer.tokenizer import Tokenizer

SECTION_VERSION = 1            # IG_CHAT_SECTION_VERSION in chat.h
MAGIC = b"IGCHAT\0\0"
FLAG_DEVELOPER_AS_SYSTEM = 1   # the template does not know "developer": it renders as "system"

# ig_chat_family in chat.h
FAMILY_NONE, FAMILY_QWEN25, FAMILY_CHATML, FAMILY_QWEN3, FAMILY_LLAMA3 = range(5)

_PARAM = "\0IGNIS-PARAM\0"     # what a parameter's text is replaced with before hashing


class UnsupportedChatTemplateError(ChatTemplateError):
    """A chat template that no renderer of the native library reproduces exactly."""


@dataclass(frozen=True)
class Family:
    id: int
    name: str
    examples: str                          # the models whose templates these are, for messages
    fingerprint: str                       # sha256 of the skeleton (parameters cut out)
    # the default system prompt: its text, found by this pattern (group 1) in the template
    system_pattern: re.Pattern[str] | None = None
    bos: bool = False                      # the template prints bos_token


def _literal(pattern: str) -> re.Pattern[str]:
    # the captured text must be a plain Jinja string literal's body: no quote, no backslash
    # escape, so its text is what the template prints
    return re.compile(pattern.replace("TEXT", r"([^'\"\\{}%]+)"))


FAMILIES = (
    Family(FAMILY_QWEN25, "qwen2.5", "Qwen2.5 instruct (qwen2.5-coder-0.5b-instruct)",
           "597aac8e492bf9752d80e1b78099e824347251f51263105758e250f520f0d7b1",
           _literal(r"\{\{- 'TEXT' \}\}")),
    Family(FAMILY_CHATML, "chatml-default-system", "SmolLM2 instruct (smollm2-135m-instruct)",
           "2ade3fd75124be7b19ada48da99bc49d829fab10c14c8f3ad1f125a2e00d5b74",
           _literal(r"'<\|im_start\|>system\nTEXT<\|im_end\|>\n' \}\}")),
    Family(FAMILY_QWEN3, "qwen3", "Qwen3",
           "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"),
    Family(FAMILY_LLAMA3, "llama3.2", "Llama 3.2 instruct",
           "d82792f95932f1c9cef5c4bd992f171225e3bf8c7b609b4557c9e1ec96be819f", bos=True),
)


def _normalize(template: str) -> str:
    # trim_blocks drops the first newline after a block tag: one after the last tag prints nothing
    if template.endswith("%}\n"):
        template = template[:-1]
    return template


def _skeleton(template: str, family: Family) -> tuple[str, str | None]:
    """The template with the family's parameter cut out, and the parameter's text (None: the
    family has none; "" and the template unchanged: it is not where the family has it, so the
    fingerprint cannot match)."""
    if family.system_pattern is None:
        return template, None
    m = family.system_pattern.search(template)
    if m is None:
        return template, ""
    text = m.group(1)
    return template.replace(text, _PARAM), text


def fingerprint(template: str, family: Family) -> tuple[str, str | None]:
    skeleton, param = _skeleton(_normalize(template), family)
    return hashlib.sha256(skeleton.encode("utf-8", "surrogatepass")).hexdigest(), param


def identify(template: str) -> tuple[Family, dict[str, str]]:
    """The family whose renderer reproduces `template`, and its parameters from the template."""
    for family in FAMILIES if _PARAM not in template else ():
        digest, param = fingerprint(template, family)
        if digest == family.fingerprint:
            return family, ({"default_system": param} if param else {})
    digest = hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()
    raise UnsupportedChatTemplateError(
        f"this chat template (sha256 {digest[:16]}...) is not one the native library renders; it "
        f"renders the templates of "
        f"{', '.join(f'{f.name} ({f.examples})' for f in FAMILIES)}. Compile the model without "
        f"chat (completions and embeddings only), or use the Python engine, which runs any "
        f"template with Jinja")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ChatTemplateError(f"{what} holds a lone surrogate; it cannot be written as "
                                f"UTF-8") from None


def _pack(family: int, flags: int, params: Mapping[str, bytes]) -> bytes:
    out = bytearray(MAGIC + struct.pack("<IIII", SECTION_VERSION, family, flags, len(params)))
    for key, value in params.items():
        k = key.encode("ascii")
        out += struct.pack("<I", len(k)) + k + struct.pack("<I", len(value)) + value
    return bytes(out)


def _spellings(texts: Iterable[str]) -> bytes:
    unique = sorted({t for t in texts if t})        # TextMasker drops empty spellings too
    out = bytearray(struct.pack("<I", len(unique)))
    for t in unique:
        b = _utf8(t, f"added token {t!r:.40}")
        out += struct.pack("<I", len(b)) + b
    return bytes(out)


def masker_spellings(tokenizer: "Tokenizer") -> list[str]:
    """The spellings ignis masks in a conversation's strings (Tokenizer._text_masker): every added
    token as written and as normalized. The renderer needs them: Python's string operations in a
    template (Qwen3's '</think>' in content) do not see text that is masked."""
    return [t.content for t in tokenizer.added_tokens] + list(tokenizer._norm_matcher.by_text)


def chat_section(template_text: str | None, *,
                 special_tokens: Mapping[str, str] | None = None,
                 added_tokens: Iterable[str] = ()) -> bytes:
    """The chat section for a model whose tokenizer has this chat template (None or "": no
    template, so the library answers chat requests with the no-chat-template error).
    special_tokens: the tokenizer config's bos_token etc., as the template sees them;
    added_tokens: masker_spellings(tokenizer). Raises UnsupportedChatTemplateError for a template
    outside the known set."""
    if template_text is None or template_text == "":
        return _pack(FAMILY_NONE, 0, {})
    if not isinstance(template_text, str):
        raise ChatTemplateError(f"chat_template must be a string, not {type(template_text).__name__}")
    family, found = identify(template_text)
    params = {k: _utf8(v, k) for k, v in found.items()}
    if family.bos:
        bos = (special_tokens or {}).get("bos_token")
        if isinstance(bos, str):          # undefined in Jinja prints nothing
            params["bos_token"] = _utf8(bos, "bos_token")
    spellings = _spellings(added_tokens)
    if len(spellings) > 4:
        params["added_tokens"] = spellings
    # ignis renders "developer" as "system" in templates that do not name the role (chat.py)
    flags = FLAG_DEVELOPER_AS_SYSTEM if "developer" not in template_text else 0
    return _pack(family.id, flags, params)


def supported_families() -> list[str]:
    return [f.name for f in FAMILIES]

