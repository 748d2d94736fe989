"""DeepInfer's Python package (standard library only: ctypes over libdeepinfer.so).

    from deepinfer import LLM, SamplingParams
    llm = LLM()                      # model: argument, else $DEEPINFER_HF_MODEL_DIR, else models/default
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(out[0].outputs[0].text)
"""
from .llm import LLM, default_model_dir
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import SamplingParams, StructuredOutputsParams
from ._lib import DeepInferError

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "Logprob",
           "RequestMetrics", "DeepInferError", "default_model_dir"]
__version__ = "0.1.0"
