from aml_evaluation.isolation import content_text, find_leaks, owners_of_texts


def test_text_written_only_for_another_user_is_a_leak() -> None:
    owners = owners_of_texts([("a", "tea"), ("b", "coffee"), ("a", "hello"), ("b", "hello")])
    candidates = [
        {"id": "1", "content": "tea"},
        {"id": "2", "content": "coffee"},
        {"id": "3", "content": "hello"},  # written for both: not a leak
        {"id": "4", "content": "never written"},  # unknown text: not provable, not a leak
    ]
    leaks = find_leaks("a", candidates, owners)
    assert [(leak.rank, leak.candidate_id, leak.written_for) for leak in leaks] == [(2, "2", ["b"])]
    assert find_leaks("b", candidates, owners)[0].candidate_id == "1"


def test_content_parts_are_compared_by_their_text() -> None:
    owners = owners_of_texts([("b", "coffee")])
    parts = [{"type": "text", "text": "coffee"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert content_text(parts) == "coffee"
    assert len(find_leaks("a", [{"id": "x", "content": parts}], owners)) == 1
    assert content_text([{"type": "image_url", "image_url": {"url": "u"}}]) is None
