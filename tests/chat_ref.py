#!/usr/bin/env python3
"""chat_ref.py - renders conversations through models' real chat templates
with Jinja, the way model servers do, for tests/test_chat_tools.c to compare
with agentkv's native rendering byte for byte.

    python3 tests/chat_ref.py TEMPLATE_DIR < suite.json > renders.jsonl

Input (tests/data/chat_tools.json): {"tools": {NAME: [...]},
"conversations": {NAME: [...]}, "cases": [...]}, each case
    {"name": ..., "template": FILE (in TEMPLATE_DIR), "conversation": NAME,
     "tools": NAME (optional), "add_generation_prompt": bool (default true),
     "bos_token": ..., "eos_token": ..., "kwargs": {...} (optional, e.g.
     {"enable_thinking": false}), "format": "template" (default) |
     "generic" | "system_tools", "fix_ids": bool}
with messages and tools in OpenAI's request form (tool calls' "arguments"
a JSON string, "content" may be null). Output: one JSON object a line,
{"name": ..., "rendered": TEXT} or {"name": ..., "error": MESSAGE} when the
template raises.

Rendering as Hugging Face's apply_chat_template does: a sandboxed Jinja
environment with trim_blocks and lstrip_blocks and the loopcontrols
extension; raise_exception raises; strftime_now formats a fixed date,
26 Jul 2024; tojson is Hugging Face's (json.dumps with ensure_ascii=False,
keys in the given order, indent honoured), not Jinja's own (which sorts keys
and escapes HTML). A tool call's arguments are passed to the template as the
parsed object, as Hugging Face, vLLM and llama.cpp pass them (text that is
not JSON stays a string). Qwen3's and Phi-3.5's templates cannot take a null
content: it is passed as "" to them.

"format": "generic" is the documented format of the families whose
templates have no tool markup (docs/tools.md): the tools and calls are
written into plain messages (below) which the template then renders.
"system_tools": DeepSeek's, whose templates print no tools: the tools as
its model card lists them, after the system prompt. "fix_ids": call ids
Mistral's templates refuse (not nine characters) replaced as agentkv does.
"""
import datetime
import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

TODAY = datetime.datetime(2024, 7, 26)

NULL_CONTENT_AS_EMPTY = ("Qwen-Qwen3-0.6B.jinja", "microsoft-Phi-3.5-mini-instruct.jinja")

TOOLS_INTRO = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_OUTRO = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
               "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
               "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise TemplateError(message)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = TODAY.strftime
    return env


def parsed_arguments(text):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def deepseek_tools_block(tools, r1):
    """DeepSeek's tool list (its model card's system-prompt format); the
    call format in the instructions is R1's for R1."""
    out = "## Tools\nYou have access to the following tools:\n"
    for t in tools:
        f = t["function"]
        out += "\n### " + f["name"] + "\nDescription: " + f.get("description", "") + "\n\nParameters: " + \
            tojson(f.get("parameters", {})) + "\n"
    call = ("function<｜tool▁sep｜>tool_call_name\n```json\ntool_call_arguments\n```" if r1
            else "tool_call_name<｜tool▁sep｜>tool_call_arguments")
    return (out + "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + call +
            "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n\n"
            "- `tool_call_name` must be an exact match to one of the available tools\n"
            "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
            "- For multiple tool calls, chain them directly without separators or spaces\n")


def with_system_tools(messages, tools, r1):
    """The tools block after the last system message's text (a system
    message of its own, first, when there is none)."""
    if not tools:
        return messages
    out = [dict(m) for m in messages]
    block = deepseek_tools_block(tools, r1)
    last = max((i for i, m in enumerate(out) if m["role"] == "system"), default=-1)
    if last < 0:
        return [{"role": "system", "content": block}] + out
    out[last]["content"] += "\n\n" + block
    return out


def mistral_id(id):
    """Nine letters and digits from the FNV-1a hash of an id of another length."""
    if len(id.encode()) == 9:
        return id
    h = 1469598103934665603
    for byte in id.encode():
        h = ((h ^ byte) * 1099511628211) % (1 << 64)
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    for _ in range(9):
        out += digits[h % 62]
        h //= 62
    return out


def fixed_ids(messages):
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, id=mistral_id(c["id"])) for c in m["tool_calls"]]
        if m.get("tool_call_id"):
            m["tool_call_id"] = mistral_id(m["tool_call_id"])
        out.append(m)
    return out


def server_messages(messages, template):
    """The messages as a model server hands them to the template."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None and "content" in m and template in NULL_CONTENT_AS_EMPTY:
            m["content"] = ""
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                c["function"] = dict(c["function"])
                c["function"]["arguments"] = parsed_arguments(c["function"]["arguments"])
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


def generic_messages(messages, tools):
    """The documented format for templates without tool markup: the tools
    follow the system message's text (a system message of their own when
    there is none), a call is "<tool_call>\\n{"name": N, "arguments": A}\\n</tool_call>"
    after the reply's text (a newline between), and consecutive tool results
    are one user message of "<tool_response>\\nR\\n</tool_response>" blocks,
    one per line."""
    out = []
    rest = list(messages)
    if tools:
        block = TOOLS_INTRO + "".join("\n" + tojson(t) for t in tools) + TOOLS_OUTRO
        if rest and rest[0]["role"] == "system":
            out.append({"role": "system", "content": rest[0]["content"] + "\n\n" + block})
            rest = rest[1:]
        else:
            out.append({"role": "system", "content": block})
    for m in rest:
        if m["role"] == "tool":
            text = "<tool_response>\n" + m["content"] + "\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool": True})
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            parts = [m["content"]] if m.get("content") else []
            for c in m["tool_calls"]:
                args = parsed_arguments(c["function"]["arguments"])
                parts.append("<tool_call>\n{\"name\": \"" + c["function"]["name"] + "\", \"arguments\": " +
                             tojson(args) + "}\n</tool_call>")
            out.append({"role": "assistant", "content": "\n".join(parts)})
            continue
        out.append({"role": m["role"], "content": m["content"]})
    for m in out:
        m.pop("_tool", None)
    return out


def fold_system(messages):
    """Gemma's form of a system message (the template refuses one): its text
    and a blank line in front of the next user message."""
    out, pending = [], None
    for m in messages:
        if m["role"] == "system":
            pending = m["content"] if pending is None else pending + "\n\n" + m["content"]
        elif m["role"] == "user" and pending is not None:
            out.append({"role": "user", "content": pending + "\n\n" + m["content"]})
            pending = None
        else:
            out.append(m)
    if pending is not None:
        out.append({"role": "user", "content": pending})
    return out


def render(env, template_dir, case):
    with open(template_dir + "/" + case["template"], encoding="utf-8") as f:
        template = env.from_string(f.read())
    tools = case.get("tools")
    if case.get("fix_ids"):
        case = dict(case, messages=fixed_ids(case["messages"]))
    if case.get("format") == "system_tools":
        r1 = "R1" in case["template"]
        case = dict(case, messages=with_system_tools(case["messages"], tools, r1))
        tools = None
    if case.get("format") == "generic":
        messages = generic_messages(case["messages"], tools)
        if case["template"].startswith("google-gemma-2"):
            messages = fold_system(messages)
        tools = None
    else:
        messages = server_messages(case["messages"], case["template"])
    args = dict(case.get("kwargs") or {})
    if tools is not None:
        args["tools"] = tools
    return template.render(messages=messages, add_generation_prompt=case.get("add_generation_prompt", True),
                           bos_token=case.get("bos_token", ""), eos_token=case.get("eos_token", ""), **args)


def main():
    template_dir = sys.argv[1]
    env = environment()
    suite = json.load(sys.stdin)
    for case in suite["cases"]:
        case = dict(case, messages=suite["conversations"][case["conversation"]])
        case["tools"] = suite["tools"][case["tools"]] if case.get("tools") else None
        try:
            line = {"name": case["name"], "rendered": render(env, template_dir, case)}
        except TemplateError as e:
            line = {"name": case["name"], "error": str(e)}
        print(json.dumps(line, ensure_ascii=False))


if __name__ == "__main__":
    main()
