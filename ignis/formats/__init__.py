"""Weight formats: the names of the forms a model's matmul weights can run in, in one place for the
runtime, the CLI and the benchmarks (each format to become a module of its own here)."""
WEIGHT_FORMATS = ("f32", "bf16", "q8", "q4", "gguf")

__all__ = ["WEIGHT_FORMATS"]
