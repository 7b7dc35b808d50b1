"""OpenAI stop sequences: removed from the output, held back while undecided, flushed otherwise."""

from __future__ import annotations

import pytest

from trtllm_truss.api.stops import StopSequenceTrimmer


def _run(stops, chunks):
    trimmer = StopSequenceTrimmer(stops)
    emitted = [trimmer.feed(c) for c in chunks]
    return emitted, trimmer.flush(), trimmer.stopped


def test_stop_sequence_split_across_chunks_is_removed():
    emitted, tail, stopped = _run(["END"], ["Hello E", "N", "D"])
    assert "".join(emitted) + tail == "Hello " and stopped
    assert emitted[0] == "Hello "  # "E" held back: it may start "END"


def test_partial_match_that_fails_is_released():
    emitted, tail, stopped = _run(["END"], ["a EN", "d more"])
    assert "".join(emitted) + tail == "a ENd more" and not stopped


def test_text_held_at_the_end_is_flushed():
    emitted, tail, stopped = _run(["\n\n"], ["line\n"])
    assert emitted == ["line"] and tail == "\n" and not stopped


@pytest.mark.parametrize("stops", [[], ["zzz"]])
def test_no_match_passes_everything(stops):
    emitted, tail, _ = _run(stops, ["ab", "cd"])
    assert "".join(emitted) + tail == "abcd"


def test_earliest_of_several_stops_wins_and_later_text_is_dropped():
    emitted, tail, stopped = _run(["world", "lo"], ["hello world", " again"])
    assert "".join(emitted) + tail == "hel" and stopped


def test_the_stop_that_matched_is_recorded():
    trimmer = StopSequenceTrimmer(["world", "lo"])
    assert trimmer.stopped_by is None
    trimmer.feed("hel")
    assert trimmer.stopped_by is None  # "l" may still start "lo"
    trimmer.feed("lo world")
    assert trimmer.stopped_by == "lo"  # the earliest in the text, as Anthropic's stop_sequence reports


def test_native_stop_words_keep_the_stop_text_and_end_there():
    trimmer = StopSequenceTrimmer(["mode"], keep_stop=True)
    emitted = [trimmer.feed(c) for c in ["Hello, my na", "me is", " mo", "de is", " more"]]
    assert "".join(emitted) + trimmer.flush() == "Hello, my name is mode" and trimmer.stopped
