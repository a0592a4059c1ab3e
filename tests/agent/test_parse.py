import pytest

from swe_megatron.agent.parse import FormatError, parse_action


def test_one_block_is_the_command():
    assert parse_action("I will list.\n```bash\nls -la\n```\n") == "ls -la"
    assert parse_action("```\nedit 1:2\n    x = 1\nend_of_edit\n```") == "edit 1:2\n    x = 1\nend_of_edit"


@pytest.mark.parametrize(
    ("text", "count"),
    [("no block here", 0), ("```\nls\n```\nthen\n```\npwd\n```", 2), ("```\n\n```", 0), ("```\nls", 0)],
)
def test_zero_or_several_blocks_is_a_format_error(text, count):
    with pytest.raises(FormatError) as e:
        parse_action(text)
    assert e.value.count == count
