"""Constrained decoding: every output of a random-weight model follows the grammar."""

import json
import re

import jsonschema
import numpy as np
from flax import nnx

from t2t_jax.engineer import propose
from t2t_jax.env.config import make_config
from t2t_jax.models import qwen3
from t2t_jax.sampling import Constraint, Sampler
from t2t_jax.text.prompts import encode_texts
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

TOK = load_tokenizer()


def sample(constraint, n=16, max_new_tokens=600, temperature=1.0, seed=0):
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(seed))
    sampler = Sampler(model, stop_ids(TOK), TOK.pad_token_id)
    ids, mask = encode_texts(TOK, ["propose", "a config please"])
    out = sampler.generate(
        ids, mask, max_new_tokens=max_new_tokens, temperature=temperature, n=n // 2, seed=seed, constraint=constraint
    )
    texts = [TOK.decode(np.asarray(out.tokens)[i, : int(out.lengths[i])], skip_special_tokens=True) for i in range(n)]
    return texts, np.asarray(out.truncated)


def test_proposal_schema_outputs_always_parse_and_validate():
    config = make_config([{"size": [3, 5], "agents": 2}, {"size": 6, "agents": [2, 3]}])
    schema = propose.proposal_schema(config, (1, 5))
    constraint = Constraint.from_json_schema(schema, TOK)
    texts, truncated = sample(constraint)  # the schema bounds the length (< 600 characters)
    assert not truncated.any(), texts
    for text in texts:
        data = json.loads(text)
        jsonschema.validate(data, schema)
        assert 1 <= len(data["edits"]) <= 4
        for edit in data["edits"]:  # every range is ordered, so only feasibility can reject it
            assert all(edit[k][0] <= edit[k][1] for k in ("size", "agents", "hole_density")), edit


def test_regex_constraint_and_stop_only_in_final_states():
    regex = r"Agent 0: (UP|DOWN|LEFT|RIGHT)( (UP|DOWN|LEFT|RIGHT)){0,3}"
    texts, truncated = sample(Constraint.from_regex(regex, TOK), max_new_tokens=40, seed=3)
    for text, tr in zip(texts, truncated):
        if not tr:  # a finished row stopped in a final state: the whole text matches
            assert re.fullmatch(regex, text), text
        else:
            assert re.fullmatch(r"Agent 0: [A-Z ]*", text), text


def test_greedy_constrained_equals_unconstrained_when_the_grammar_allows_everything():
    """A grammar that admits any short text of these tokens must not change greedy choices it allows."""
    texts, _ = sample(Constraint.from_regex(r"[\s\S]{0,400}", TOK), n=2, max_new_tokens=12, temperature=0.0)
    free, _ = sample(None, n=2, max_new_tokens=12, temperature=0.0)
    assert texts == free
