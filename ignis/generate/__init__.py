"""Generation: sampling parameters, the sampler, stop rules, and the streaming generation loop."""
from .errors import (ContextLengthExceeded, GenerationCancelled, GenerationError,
                     InvalidParameterError, ModelBusyError)
from .loop import (Chunk, Generation, GenerationResult, KVSession, StopMatcher, cancel_when,
                   raise_if_cancelled)
from .params import SamplingParams, resolve_params
from .sampler import Sampler, TokenLogprob, TopLogprob, log_softmax

__all__ = [
    "Chunk", "ContextLengthExceeded", "Generation", "GenerationCancelled", "GenerationError",
    "GenerationResult", "cancel_when", "raise_if_cancelled",
    "InvalidParameterError", "KVSession", "ModelBusyError", "Sampler", "SamplingParams",
    "StopMatcher", "TokenLogprob", "TopLogprob", "log_softmax", "resolve_params",
]
