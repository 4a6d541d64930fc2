"""User and model text in Markdown metadata is shown as code, never rendered: rendered with a
CommonMark parser (tables on, as Dagster's UI), no image, link or heading comes from the text."""

from __future__ import annotations

import json

import polars as pl
from markdown_it import MarkdownIt
from quality_helpers import generation_rows

from eagle3_dagster.ingest.preview import prompts_preview_markdown
from eagle3_dagster.markdown import code_span, fence
from eagle3_dagster.report.previews import histograms_markdown, sample_preview_markdown

IMG = "![pixel](https://tracker.example/p.png)"
HOSTILE = [
    IMG,
    f"see ```\n{IMG}\n```",
    f"````\n# heading\n{IMG}\n`````",
    f"`x` {IMG} [link](https://tracker.example/)",
    "``",
    "`",
]


def _html(md: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(md)


def _assert_inert(md: str) -> None:
    html = _html(md)
    assert "<img" not in html and "<a " not in html and "<h1" not in html, html


def test_fence_and_code_span_hold_any_backtick_run():
    for text in HOSTILE:
        _assert_inert(fence(text))
        _assert_inert("- " + code_span(text))
        # the text comes back verbatim from the rendered code block
        block = MarkdownIt("commonmark").parse(fence(text))[0]
        assert block.type == "fence" and block.content == text + "\n"


def _prompts(texts: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "prompt_id": [f"{i:064x}" for i in range(len(texts))],
            "source": ["web"] * len(texts),
            "shard": [0] * len(texts),
            "n_messages": [1] * len(texts),
            "messages": [json.dumps([{"role": "user", "content": t}]) for t in texts],
            "tools": [None] * len(texts),
        }
    )


def test_prompts_preview_shows_prompt_text_as_code():
    md = prompts_preview_markdown(_prompts(HOSTILE), n=len(HOSTILE))
    _assert_inert(md)
    assert md.count("- `") == len(HOSTILE)  # one line per prompt, each text in its own fence
    assert "![pixel](https://tracker.example/p.png)" in md


def test_sample_preview_tool_name_and_server_strings_are_code(kimi, kimi_tokenizer, kimi_profile):
    tool = (f"functions.`{IMG}`:0", '{"q": "x"}')
    gens = generation_rows(
        [dict(sample_id="s", prompt_id="p", output_ids=kimi.output(IMG, IMG, tool=tool), finish_reason=f"`{IMG}`")]
    )
    _assert_inert(sample_preview_markdown(gens, None, kimi_tokenizer, kimi_profile))


def test_histogram_values_cannot_break_their_fence():
    _assert_inert(histograms_markdown(pl.DataFrame({"finish_reason": [f"```\n{IMG}", "stop"]}), ["finish_reason"]))
