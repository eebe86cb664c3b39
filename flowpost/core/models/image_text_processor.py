"""The Qwen2-VL processor of an edit pipeline, for images and text only: transformers builds its video part only
with torchvision installed, and the edit pipelines never pass videos."""

from __future__ import annotations

from typing import Any

from flowpost.core.models.pretrained import PretrainedSource

PROCESSOR = "processor"  # the pipeline component holding the tokenizer and the image processor


def image_text_processor_class() -> type:
    """``Qwen2VLProcessor`` without its video processor: same tokens, same image-token expansion."""
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageTextProcessor(Qwen2VLProcessor):
        """``Qwen2VLProcessor`` over ``image_processor`` and ``tokenizer`` alone."""

        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None) -> None:
            self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
            self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
            self.image_token_id = getattr(tokenizer, "image_token_id", None) or tokenizer.convert_tokens_to_ids(
                self.image_token
            )
            self.video_token_id = getattr(tokenizer, "video_token_id", None) or tokenizer.convert_tokens_to_ids(
                self.video_token
            )
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    # saved (processor_config.json, a pipeline's model_index.json) as the Qwen2VLProcessor it stands for
    ImageTextProcessor.__name__ = ImageTextProcessor.__qualname__ = Qwen2VLProcessor.__name__
    ImageTextProcessor.__module__ = Qwen2VLProcessor.__module__
    return ImageTextProcessor


def load_image_text_processor(source: PretrainedSource) -> Any:
    """The pipeline's ``processor/`` component: its tokenizer and its Qwen2-VL image processor."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    tokenizer = source.load(PROCESSOR, AutoTokenizer, weights=False)
    images = source.load(PROCESSOR, Qwen2VLImageProcessor, weights=False)
    return image_text_processor_class()(image_processor=images, tokenizer=tokenizer)
