"""The fleet plan: `tp4 fleet plan --json` (tp4.serving.fleet.plan_json builds it through
:class:`FleetPlan`): the lines behind the router and the router as it will run, with no secret
(the API key is named by its file, never shown)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.FLEET
RouterKindName = Literal["sglang-router", "smg"]
Policy = Literal["round_robin", "cache_aware", "power_of_two", "random"]
HealthEndpoint = Literal["/health_generate", "/health"]
RouterService = Literal["process", "unit"]


class FleetPlanLine(Closed):
    """One line behind the router."""

    name: str = Field(description="The line's name in tp4 output.")
    api: str = Field(description="The line's OpenAI API (its head), which the router sends requests to.")
    nodes: list[str] = Field(description="The line's nodes, head first.")
    image: str = Field(description="The image reference the line's plan runs.")
    model: str | None = Field(description="The model name the line serves (SERVED_MODEL_NAME).")
    source: str = Field(description="The profile the line was planned from.")


class RouterHealth(Closed):
    """How the router checks each line."""

    endpoint: HealthEndpoint = Field(description="What the router probes: /health_generate generates one token.")
    timeout: int = Field(description="Seconds a probe may take.")
    interval: int = Field(description="Seconds between probes.")
    failure_threshold: int = Field(description="Failed probes in a row before a line is taken out.")
    success_threshold: int = Field(description="Good probes in a row before it comes back.")


class FleetPlanRouter(Closed):
    """The router, as `tp4 fleet serve` starts it."""

    kind: RouterKindName = Field(description="Which router package runs.")
    host: str = Field(description='Where it runs: "local" (this machine) or the ssh address of a host.')
    port: int = Field(description="The router's OpenAI API port.")
    policy: Policy = Field(description="How requests are spread over the lines.")
    metrics: str = Field(description="The router's Prometheus endpoint, on its host's loopback.")
    health: RouterHealth = Field(description="How it checks each line.")
    state_dir: str = Field(
        description="The router's pid file, log and key file on its host: the fleet file's router.state_dir, "
        "/var/lib/tp4-router for the unit (its StateDirectory), else $XDG_STATE_HOME/tp4/router of the router's user, "
        "resolved on its host."
    )
    api_key: str | None = Field(
        description="Where the API key is read from at serve time (never the key); null: no key."
    )
    argv: list[str] = Field(description="The router's argv, the launcher script shown as `<launcher>`.")
    service: RouterService = Field(
        description="How it runs: a plain process in its own session, or the NixOS module's tp4-router.service."
    )
    python: str | None = Field(
        description="The Python the router runs with on its host (null: the Python running tp4)."
    )
    command: list[str] = Field(
        description="The full command (what nixosModules.tp4-router runs): its Python, the launcher and the arguments over every line; the key is read from its file."
    )


class FleetPlan(Closed):
    """`tp4 fleet plan --json`: the fleet file, planned."""

    schema_: Literal["tp4.fleet/1"] = version(SCHEMA)
    source: str = Field(description="The fleet file.")
    url: str = Field(description="The router's API as clients reach it.")
    lines: list[FleetPlanLine] = Field(description="The lines, in the fleet file's order.")
    router: FleetPlanRouter = Field(description="The router.")
    warnings: list[str] = Field(description="What the fleet's rules allowed but an operator should know.")


MODELS: tuple[type[Closed], ...] = (FleetPlan, FleetPlanLine, FleetPlanRouter, RouterHealth)
