"""Text detectors for the OCR scorer: easyocr (CRAFT, PyTorch) and rapidocr (PP-OCR, ONNX Runtime,
weights inside the wheel). See base.py for the interface."""
from .base import BACKENDS, DetectorBackend, make_backend

__all__ = ["BACKENDS", "DetectorBackend", "make_backend"]
