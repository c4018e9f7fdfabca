from aml_answerer.handlers import fit_candidates


def test_keeps_the_ranked_prefix_that_fits() -> None:
    candidates = [
        {"id": "a", "content": "x" * 40, "created_at": "2023-05-08"},
        {"id": "b", "content": "y" * 40},
        {"id": "c", "content": "z" * 5},
    ]
    # 50 + 40 = 90 fits; the short third one would fit too but is never pulled ahead of rank.
    assert fit_candidates(candidates, 90) == [("x" * 40, "2023-05-08"), ("y" * 40, None)]
    assert fit_candidates(candidates, 89) == [("x" * 40, "2023-05-08")]


def test_first_candidate_is_kept_even_when_too_long() -> None:
    assert fit_candidates([{"content": "x" * 500}], 10) == [("x" * 500, None)]


def test_content_parts_use_their_text() -> None:
    parts = [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert fit_candidates([{"content": parts}], 100) == [("hello", None)]


def test_no_candidates() -> None:
    assert fit_candidates([], 100) == []
