"""An agent framework from PyPI against `ignis serve`, unchanged: Pydantic AI (pydantic-ai-slim[openai],
in the test extras) through both of its OpenAI models, chat completions and the Responses API.
Structured output as Pydantic AI asks for it (a forced output tool, and NativeOutput's
json_schema) on the tiny model; a tool-calling agent on the real default model (slow)."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

pytest.importorskip("openai", reason="the official client (test extras)")
pytest.importorskip("uvicorn", reason="ignis serve needs the server extra")
pydantic_ai = pytest.importorskip("pydantic_ai", reason="pip install 'pydantic-ai-slim[openai]' "
                                                       "(in the test extras)")
from pydantic_ai import Agent, NativeOutput  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

from test_tools import tool_model_dir  # noqa: E402

MODELS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel}


class City(BaseModel):
    city: str
    country: str


def _model(server, name: str, api: str):
    provider = OpenAIProvider(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    return MODELS[api](name, provider=provider)


@pytest.fixture(scope="module")
def tiny_server(tiny_chat_dir, tmp_path_factory):
    from test_server import Server
    d = tool_model_dir(tiny_chat_dir, tmp_path_factory.mktemp("agents") / "tiny-agents")
    s = Server(d, d.parent / "server.log", "--ctx", "2048")
    yield s, d.name
    s.stop()


@pytest.mark.parametrize("api", sorted(MODELS))
@pytest.mark.parametrize("mode", ["tool", "native"])
def test_structured_output(tiny_server, api, mode):
    """Pydantic AI's default structured output is a final_result tool it forces; NativeOutput
    sends the JSON schema (response_format / text.format). Either way the answer is read and
    validated into the class by the framework itself."""
    server, name = tiny_server
    output = City if mode == "tool" else NativeOutput(City)
    agent = Agent(_model(server, name, api), output_type=output)
    r = agent.run_sync("Where is the Eiffel Tower?",
                       model_settings={"max_tokens": 120, "temperature": 0.7, "seed": 3})
    assert isinstance(r.output, City)


@pytest.fixture(scope="module")
def real_server(default_model_dir, tmp_path_factory):
    from test_server import Server
    s = Server(default_model_dir, tmp_path_factory.mktemp("agents-real") / "server.log",
               "--ctx", "4096")
    yield s, default_model_dir.name
    s.stop()


@pytest.mark.slow
@pytest.mark.parametrize("api", sorted(MODELS))
def test_real_model_structured_output_and_tool_call(real_server, api):
    server, name = real_server
    model = _model(server, name, api)
    settings = {"max_tokens": 200, "temperature": 0}
    r = Agent(model, output_type=City).run_sync(
        "Where is the Eiffel Tower? Answer with the city and country.", model_settings=settings)
    assert r.output == City(city="Paris", country="France")
    calls: list[str] = []

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return "21 C and sunny"

    agent = Agent(model, tools=[get_weather],
                  system_prompt="You are a helpful assistant. Use the tools to answer.")
    r = agent.run_sync("What's the weather like in Paris right now?", model_settings=settings)
    assert calls and calls[0] == "Paris" and isinstance(r.output, str)
