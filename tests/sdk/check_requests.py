#!/usr/bin/env python3
"""Check request bodies against the official anthropic SDK's request types.

    check_requests.py DIR      # every DIR/*.json is one Messages API request body

Each body is validated with pydantic against
`anthropic.types.message_create_params.MessageCreateParamsNonStreaming`, strictly:

- strict mode (no coercion: "10" is not an integer);
- unknown keys are refused: every request TypedDict of the SDK that does not set its own
  pydantic config is given `extra="forbid"`, and so are the SDK's response models, which
  the content unions also accept (a dict with a stray key would otherwise pass as a
  response block);
- the SDK declares lists as `Iterable[...]`, which pydantic validates lazily: every
  iterable in the result is consumed, so its items are validated too;
- the validated value must equal the body (nothing dropped or converted).

Before the bodies, a self-check: a good request must pass and deliberately broken ones
(derived from the first body) must fail, so a validator that accepts anything cannot
make this script pass. Exits non-zero on any failure, or when DIR has no bodies.
"""
import copy
import importlib
import json
import pkgutil
import sys
from pathlib import Path

import anthropic
import anthropic.types
import pydantic
from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import is_typeddict


def forbid_unknown_keys():
    """Refuse unknown keys in every request type and response model of anthropic.types."""
    package = anthropic.types
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if ".beta" in info.name:
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if not isinstance(value, type) or value.__module__ != module.__name__:
                continue
            if is_typeddict(value):
                # Keep the SDK's own choice where it made one (a tool's input schema
                # allows any JSON Schema keyword).
                if "__pydantic_config__" not in value.__dict__:
                    value.__pydantic_config__ = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
            elif issubclass(value, pydantic.BaseModel):
                value.model_config["extra"] = "forbid"
                value.model_rebuild(force=True)


def consume(value):
    """The validated value with every lazily validated iterable read (and so validated)."""
    if isinstance(value, dict):
        return {k: consume(v) for k, v in value.items()}
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if hasattr(value, "__iter__"):
        return [consume(v) for v in value]
    return value


def make_checker():
    forbid_unknown_keys()
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

    adapter = TypeAdapter(MessageCreateParamsNonStreaming)

    def check(body):
        """None when the body is valid, else the reason."""
        try:
            validated = consume(adapter.validate_python(body, strict=True))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return f"{e.error_count()} errors, e.g. at {where}: {first['msg']}"
        if validated != body:
            return "the validated value differs from the body (a key dropped or a value converted)"
        return None

    return check


def broken_variants(body):
    """Bodies the SDK's types must refuse, each with what was broken."""
    out = []

    def variant(name, edit):
        b = copy.deepcopy(body)
        if edit(b) is not False:
            out.append((name, b))

    variant("max_tokens missing", lambda b: b.pop("max_tokens"))
    variant("max_tokens as a string", lambda b: b.__setitem__("max_tokens", str(b["max_tokens"])))
    variant("a message with role robot", lambda b: b["messages"][0].__setitem__("role", "robot"))
    variant("an unknown top-level key", lambda b: b.__setitem__("temperature_bogus", 1))

    def first_block(b):
        content = b["messages"][0]["content"]
        if isinstance(content, str):
            b["messages"][0]["content"] = [{"type": "text", "text": content}]
        return b["messages"][0]["content"][0]

    variant("an unknown key in a content block", lambda b: first_block(b).__setitem__("bogus", True))
    variant("a content block of an unknown type", lambda b: first_block(b).__setitem__("type", "cache_edits"))
    variant("text that is not a string", lambda b: first_block(b).__setitem__("text", 5))
    variant("a cache marker of an unknown type", lambda b: first_block(b).__setitem__("cache_control", {"type": "forever"}))

    def results(b):
        return [blk for m in b["messages"] if isinstance(m["content"], list) for blk in m["content"] if blk.get("type") == "tool_result"]

    def break_result(b):
        found = results(b)
        if not found:
            return False
        found[0]["cache_reference"] = found[0]["tool_use_id"]

    variant("a tool result with a cache_reference", break_result)

    def last_block(b):
        content = b["messages"][-1]["content"]
        if isinstance(content, str):
            return False
        content[-1]["bogus"] = True

    variant("an unknown key in the last block of the last message", last_block)
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    paths = sorted(Path(sys.argv[1]).glob("*.json"))
    if not paths:
        print(f"no request bodies in {sys.argv[1]}", file=sys.stderr)
        return 1
    check = make_checker()

    # The self-check starts from a body with tool results and several messages.
    sample = next((p for p in paths if '"tool_result"' in p.read_text()), paths[0])
    first = json.loads(sample.read_text())
    problem = check(first)
    if problem is not None:
        print(f"self-check: {sample.name} should pass: {problem}", file=sys.stderr)
        return 1
    accepted = [name for name, body in broken_variants(first) if check(body) is None]
    if accepted:
        for name in accepted:
            print(f"self-check: a body with {name} was accepted", file=sys.stderr)
        return 1
    print(f"self-check: {sample.name} passes, {len(broken_variants(first))} broken copies of it are refused")

    failed = 0
    for path in paths:
        problem = check(json.loads(path.read_text()))
        if problem is not None:
            failed += 1
            if failed <= 20:
                print(f"{path.name}: {problem}", file=sys.stderr)
    print(f"anthropic {anthropic.__version__}, pydantic {pydantic.VERSION}: "
          f"{len(paths) - failed} requests valid, {failed} invalid")
    print(f"{len(paths) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
