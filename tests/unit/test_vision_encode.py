"""Image-text records -> ids exactly as the Hugging Face processor gives them.

Oracle: ``processor(text=processor.apply_chat_template(messages), images=pixels)`` on a
processor directory built offline (tests/vlm_processors.py) and loaded with
``AutoProcessor.from_pretrained``, with synthetic pixels of each record's image sizes. The
stored ids must equal its ``input_ids``, the image-token count the processor's, and the loss
mask must train exactly each assistant answer and its end-of-turn, never an image token.
Layouts: image parts (HF and OpenAI ``image_url``, bytes, data URI, relative path), LLaVA
``<image>`` placeholders, caption records; bad records name what is wrong.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bcl_stream.records.image_text import read_image_record
from bcl_stream.records.kind import Bad, LayoutOptions
from bcl_stream.text.loss_spans import mask_from_spans
from bcl_stream.text.templates import TemplateError
from bcl_stream.vision.encode import ImageRecord, ImageTextEncoder
from bcl_stream.vision.image_header import ImageError

transformers = pytest.importorskip("transformers")

OPTIONS = LayoutOptions()


def _png(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed + 31 * width + height)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.vlm_processors import qwen2_vl_processor_dir

    return qwen2_vl_processor_dir(tmp_path_factory.mktemp("qwen2vl"))


@pytest.fixture(scope="module")
def qwen(qwen_dir: Path) -> tuple[ImageTextEncoder, object]:
    return ImageTextEncoder(str(qwen_dir)), transformers.AutoProcessor.from_pretrained(
        str(qwen_dir)
    )


def _records(tmp_path: Path) -> list[dict]:
    (tmp_path / "imgs").mkdir(exist_ok=True)
    (tmp_path / "imgs" / "a.png").write_bytes(_png(64, 40))
    uri = "data:image/png;base64," + base64.b64encode(_png(300, 20)).decode()
    return [
        {  # one image, string answer
            "messages": [
                {"role": "user", "content": [{"type": "image", "image": _png(100, 60)},
                                             {"type": "text", "text": "What is this?"}]},
                {"role": "assistant", "content": "A box."},
            ]
        },
        {  # two turns, two images, a system prompt, parts answer
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "first"},
                                             {"type": "image", "image": _png(13, 900)}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Tall."}]},
                {"role": "user", "content": [{"type": "image", "image": _png(1, 1)},
                                             {"type": "text", "text": "and this"}]},
                {"role": "assistant", "content": "A dot."},
            ]
        },
        {  # OpenAI image_url with a data URI, two images in one turn
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                             {"type": "image_url", "image_url": {"url": uri}},
                                             {"type": "text", "text": "Same?"}]},
                {"role": "assistant", "content": "Yes."},
            ]
        },
        {  # LLaVA: ShareGPT with <image> placeholders and a relative path
            "image": "imgs/a.png",
            "conversations": [
                {"from": "human", "value": "<image>\nDescribe the picture."},
                {"from": "gpt", "value": "Numbers 1 2 3."},
            ],
        },
        {"image": {"bytes": _png(640, 480), "path": None}, "caption": "The quick brown fox."},
        {"messages": [{"role": "user", "content": "no image"}, {"role": "assistant", "content": "ok"}]},
    ]  # fmt: skip


def _oracle(processor: object, record: ImageRecord) -> dict:
    text = processor.apply_chat_template(record.conversation.messages, tokenize=False)
    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in record.images]
    return processor(text=[text], images=images or None, return_tensors="pt")


def test_ids_equal_the_processor_on_every_layout(qwen, tmp_path: Path) -> None:
    encoder, processor = qwen
    pad = encoder.image_token_id
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for i, raw in enumerate(_records(tmp_path)):
        source = f"{tmp_path / 'in.jsonl'}:{i + 1}"
        record = read_image_record(source, raw, OPTIONS, str(tmp_path))
        assert isinstance(record, ImageRecord), record
        out = encoder.encode(record, source)
        want = _oracle(processor, record)
        ids = out.ids
        assert ids.tolist() == want["input_ids"][0].tolist(), i
        grids = want["image_grid_thw"].tolist() if record.images else []
        assert [encoder.geometry.grid(w, h) for w, h in out.sizes] == [tuple(g) for g in grids]
        assert out.image_tokens == int((ids == pad).sum())
        assert list(out.patches) == [int(np.prod(g)) for g in grids]
        assert out.text_tokens + out.image_tokens == ids.size
        # the mask: each assistant answer and its end-of-turn, never an image token
        mask = mask_from_spans(out.spans, ids.size)
        assert not mask[ids == pad].any()
        trained = processor.tokenizer.decode(ids[mask])
        answers = [
            m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
            for m in record.conversation.messages
            if m["role"] == "assistant"
        ]
        assert trained == "".join(f"{a}<|im_end|>\n" for a in answers), i
        assert int(ids[mask][-2]) == end


def test_caption_is_the_answer_to_the_image(qwen, tmp_path: Path) -> None:
    record = read_image_record("s.tar:k1", {"jpg": None, "image": _png(50, 50), "txt": "A cat."},
                               OPTIONS, None)  # fmt: skip
    assert isinstance(record, ImageRecord)
    assert record.conversation.messages == [
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    ]


def test_llava_processor_ids_are_exact(tmp_path: Path) -> None:
    """The fixed-tile family: 576 ``<image>`` tokens per image whatever its size."""
    from tests.vlm_processors import llava_processor_dir

    root = llava_processor_dir(tmp_path / "llava")
    template = (
        "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}"
        "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
        "<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    )
    processor = transformers.AutoProcessor.from_pretrained(str(root))
    processor.tokenizer.chat_template = template
    processor.tokenizer.save_pretrained(str(root))
    processor = transformers.AutoProcessor.from_pretrained(str(root))
    encoder = ImageTextEncoder(str(root))
    raw = {"image": [_png(20, 700), _png(640, 480)], "conversations": [
        {"from": "human", "value": "<image> and <image>: same?"},
        {"from": "gpt", "value": "No."}]}  # fmt: skip
    record = read_image_record("x:1", raw, OPTIONS, None)
    assert isinstance(record, ImageRecord)
    out = encoder.encode(record, "x:1")
    text = processor.tokenizer.apply_chat_template(record.conversation.messages, tokenize=False)
    want = processor(
        text=text, images=[Image.open(io.BytesIO(b)).convert("RGB") for b in record.images]
    )
    assert out.ids.tolist() == list(want["input_ids"][0])
    assert out.image_tokens == 2 * 576 and out.patches == (576, 576)


@pytest.mark.parametrize(
    ("raw", "reason", "match"),
    [
        (
            {"image": ["a.png", "b.png"], "conversations": [
                {"from": "human", "value": "<image> what?"}, {"from": "gpt", "value": "x"}]},
            "bad_images",
            "1 <image> placeholders in the messages but 2 images",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "nope.png"}]},
                          {"role": "assistant", "content": "x"}]},
            "image_missing",
            "image 0: .*nope.png not found",
        ),
        (
            {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
                {"role": "assistant", "content": "x"}]},
            "bad_images",
            "network URL",
        ),
        ({"image": "a.png", "caption": ""}, "no_trained_tokens", "caption is empty"),
        ({"image": "a.png"}, "missing_field", "needs messages, or an image and a caption"),
    ],
)  # fmt: skip
def test_bad_records_name_what_is_wrong(tmp_path: Path, raw: dict, reason: str, match: str) -> None:
    got = read_image_record("in.jsonl:7", raw, OPTIONS, str(tmp_path))
    assert isinstance(got, Bad)
    assert got.reason == reason and got.source == "in.jsonl:7"
    assert __import__("re").search(match, got.message), got.message


def test_bad_images_raise_with_the_record_named(qwen) -> None:
    encoder, _ = qwen

    def conv(data: bytes) -> ImageRecord:
        got = read_image_record("in.jsonl:3", {"image": data, "caption": "c"}, OPTIONS, None)
        assert isinstance(got, ImageRecord)
        return got

    with pytest.raises(ImageError, match=r"in.jsonl:3 image 0: image is not an image") as info:
        encoder.encode(conv(b"not an image"), "in.jsonl:3")
    assert info.value.reason == "image_unreadable"
    with pytest.raises(
        ImageError, match=r"in.jsonl:3: image size 600x2: aspect ratio 300\.0"
    ) as info:
        encoder.encode(conv(_png(600, 2)), "in.jsonl:3")
    assert info.value.reason == "image_aspect"


def test_image_token_in_the_text_is_refused(qwen) -> None:
    encoder, _ = qwen
    record = read_image_record(
        "x:1",
        {"messages": [{"role": "user", "content": "<|image_pad|> sneaky"},
                      {"role": "assistant", "content": "x"}]},
        OPTIONS,
        None,
    )  # fmt: skip
    assert isinstance(record, ImageRecord)
    with pytest.raises(TemplateError, match="rendered 1 <\\|image_pad\\|> tokens for 0 images"):
        encoder.encode(record, "x:1")


def test_a_caption_record_without_a_processor_is_refused_not_read_as_text(tmp_path: Path) -> None:
    """The image-text kind is registered last: a record whose content is an image and a
    caption is detected as image-text, and a text encoder refuses it (``needs_processor``)
    instead of training the caption with its image dropped."""
    import json

    from bcl_stream.preprocess.work import EncodeOptions, tokenize_stream

    f = tmp_path / "in.jsonl"
    raws = [
        (f"{f}:1", json.dumps({"image": "a.png", "caption": "a cat"}).encode()),
        (f"{f}:2", json.dumps({"text": "plain", "image": "a.png"}).encode()),  # text first
    ]
    (tmp_path / "a.png").write_bytes(_png(20, 20))
    out = dict(tokenize_stream(iter(raws), EncodeOptions("cl100k"), workers=1))
    first = out[f"{f}:1"]
    assert isinstance(first, Bad) and first.reason == "needs_processor", first
    assert not isinstance(out[f"{f}:2"], Bad)
