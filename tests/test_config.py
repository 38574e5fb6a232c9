"""EnvConfig: legal ranges named in errors, JSON round trip, unsatisfiable buckets."""

import json

import pytest

from t2t_jax.env.config import ConfigError, EnvConfig, load_config, make_config


def test_json_round_trip():
    config = make_config(
        [
            {"size": [3, 6], "agents": 2, "hole_density": [0.0, 0.3], "weight": 2},
            {"size": 10, "agents": [4, 5], "hole_density": 0.5},
        ]
    )
    again = EnvConfig.from_json(config.dumps())
    assert again == config
    assert json.loads(config.dumps())["buckets"][0]["size"] == [3, 6]
    assert config.weights.tolist() == pytest.approx([2 / 3, 1 / 3])


@pytest.mark.parametrize(
    "bucket, message",
    [
        ({"size": 12}, "buckets[0].size: 12 is outside the legal range [3, 10]"),
        ({"size": 2}, "buckets[0].size: 2 is outside the legal range [3, 10]"),
        ({"agents": 6}, "buckets[0].agents: 6 is outside the legal range [1, 5]"),
        ({"hole_density": 0.7}, "buckets[0].hole_density: 0.7 is outside the legal range [0.0, 0.5]"),
        ({"hole_density": [0.3, 0.1]}, "buckets[0].hole_density: low 0.3 is above high 0.1"),
        ({"min_distance": 9, "size": 5}, "buckets[0].min_distance: 9 is outside the legal range [0, 8]"),
        ({"weight": 0}, "buckets[0].weight: 0.0 is outside the legal range (0, inf)"),
        ({"size": 3.5}, "buckets[0].size: expected integers"),
        ({"size": "big"}, "buckets[0].size: expected int values"),
        ({"colour": 1}, "buckets[0]: unknown fields ['colour']"),
    ],
)
def test_errors_name_the_field_and_range(bucket, message):
    with pytest.raises(ConfigError) as e:
        make_config([bucket])
    assert message in str(e.value)


def test_unsatisfiable_bucket_is_rejected_at_construction():
    with pytest.raises(ConfigError, match=r"buckets\[1\]: unsatisfiable: 5 agents .* on 3x3"):
        make_config([{"size": 5}, {"size": 3, "agents": 5, "hole_density": 0.5}])
    # The same agents on a larger board are fine.
    make_config([{"size": [5, 10], "agents": 5, "hole_density": 0.5}])


def test_config_level_errors():
    with pytest.raises(ConfigError, match="buckets: expected a non-empty list"):
        EnvConfig.from_json({"buckets": []})
    with pytest.raises(ConfigError, match="max_size: 40 is outside the legal range"):
        EnvConfig.from_json({"buckets": [{}], "max_size": 40})
    with pytest.raises(ConfigError, match="not valid JSON"):
        EnvConfig.from_json("{nope")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config("/nonexistent/config.json")


def test_larger_static_maxima():
    config = EnvConfig.from_json(
        {"max_size": 12, "max_agents": 6, "buckets": [{"size": 12, "agents": 6, "hole_density": 0.4}]}
    )
    assert config.max_size == 12 and config.max_agents == 6
