"""Graph -> Graph passes (one per module) and the pipeline that orders them."""
from .pipeline import OPTIONAL, PASSES, PIPELINE, SEED_PASSES, PassEntry, PassError, PipelineResult, run_pipeline, select_passes

__all__ = ["OPTIONAL", "PASSES", "PIPELINE", "SEED_PASSES", "PassEntry", "PassError", "PipelineResult", "run_pipeline",
           "select_passes"]
