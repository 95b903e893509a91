"""The smaller sections of a job spec: Kafka connection, step shape, cost model, long context."""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from pipeline.spec._problems import NO_VALUE, Problems
from pipeline.spec.context_parallel import ContextParallelCostSpec, ContextParallelSpec
from pipeline.spec.cost import CostModel, VisionCostModel
from pipeline.spec.cp_cost import ContextParallelCost
from topics.kafka.rank_principals import placeholder_problems
from topics.kafka.settings import resolve_role_settings, setting_problems

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
DEFAULT_BOOTSTRAP_SERVERS = "localhost:9092"

ConfigValue = str | int | bool
_REFERENCE_SCHEMA = {
    "type": "object",
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {"env": {"type": "string"}, "file": {"type": "string"}},
    "additionalProperties": False,
}
SettingValue = Annotated[
    Any,
    WithJsonSchema({"anyOf": [{"type": ["string", "integer", "boolean"]}, _REFERENCE_SCHEMA]}),
]
"""A librdkafka setting as a spec gives it: a value, or a secret's reference (``{env: NAME}``, ``{file: PATH}``);
checked by ``topics.kafka.settings.setting_problems``, whose messages never show a value."""


class KafkaSpec(BaseModel):
    """Where the cluster is and how to reach it."""

    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str = Field(
        DEFAULT_BOOTSTRAP_SERVERS,
        min_length=1,
        description=f"host:port[,host:port...]; overridden by --bootstrap-servers, then by ${BOOTSTRAP_ENV}.",
    )
    config: dict[str, SettingValue] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for every client of the job (security.protocol, sasl.*, ssl.*); "
        "a secret (sasl.password, ssl.key.password, ...) only as a reference: {env: VARIABLE} or {file: PATH}.",
    )
    principals: dict[str, dict[str, SettingValue]] = Field(
        default_factory=dict,
        description="Settings per role laid over config, each role its own credentials (sasl.username and a "
        "sasl.password reference; or, on an mTLS listener, ssl.certificate.location and ssl.key.location, the "
        "certificate's CN the user): loader (or loader.<source>), constructor, trainer, observer, operator. "
        "The trainer's values may name {rank} (a principal per data-parallel rank: sasl.username: job-trainer-{rank}, "
        "sasl.password: {env: PW_TRAINER_{rank}}), replaced with the rank's number by its sink.",
    )

    @model_validator(mode="after")
    def _check(self) -> KafkaSpec:
        problems = Problems("KafkaSpec")
        sections = {("config",): self.config} | {("principals", k): v for k, v in self.principals.items()}
        for loc, settings in sections.items():
            if "bootstrap.servers" in settings:
                problems.add((*loc, "bootstrap.servers"), "set kafka.bootstrap_servers instead")
            for key, message in setting_problems(settings):
                problems.add((*loc, key), message, NO_VALUE)
            for key, message in placeholder_problems(settings, loc[1] if len(loc) > 1 else None):
                problems.add((*loc, key), message, NO_VALUE)
        problems.raise_if_any()
        return self

    def resolved_bootstrap_servers(self, override: str | None = None, environ: Mapping[str, str] | None = None) -> str:
        """The bootstrap servers to use: ``override`` (the CLI's --bootstrap-servers) if given, else
        ``$KAFKA_BOOTSTRAP_SERVERS`` if set and not empty, else the spec's."""
        env = os.environ if environ is None else environ
        return override or env.get(BOOTSTRAP_ENV) or self.bootstrap_servers

    def client_config(
        self,
        override: str | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        role: str | None = None,
        source: str | None = None,
        rank: int | None = None,
    ) -> dict[str, ConfigValue]:
        """The librdkafka settings of every client of ``role`` (``source``: a loader's; ``rank``: a trainer's, for
        a trainer principal that names ``{rank}``): ``config`` with the role's principal over it
        (``topics.kafka.settings.role_principal``; no role: ``config`` alone), its
        secrets' references resolved from ``environ`` (default ``os.environ``) or their files, plus
        ``bootstrap.servers`` (see ``resolved_bootstrap_servers``). Roles add their own settings.

        ``metadata.recovery.strategy`` is ``none`` unless ``config`` says otherwise: with librdkafka's
        default (``rebootstrap``) a client that saw every broker go away (a one-broker cluster
        restarting) can wait forever for its group coordinator (confluentinc/librdkafka#5511). A cluster
        whose brokers all change address may want ``rebootstrap`` back."""
        return {
            "metadata.recovery.strategy": "none",
            **resolve_role_settings(self.config, self.principals, role, source, environ, rank),
            "bootstrap.servers": self.resolved_bootstrap_servers(override, environ),
        }


class StepSpec(BaseModel):
    """The shape of one global training step."""

    model_config = ConfigDict(extra="forbid")

    ranks: int = Field(
        ge=1, description="Data-parallel ranks (with context_parallel: every rank, data x context); one topic each."
    )
    micro_batches: int = Field(ge=1, description="Micro-batches per rank per step.")
    tokens_per_micro_batch: int = Field(
        ge=1, description="Packed length of one micro-batch (with context_parallel: the slice tokens a rank holds)."
    )
    patches_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="The vision encoder's budget: the most image and video patches one micro-batch holds "
        "(unset: no limit).",
    )
    context_parallel: ContextParallelSpec | None = Field(
        None, description="Long samples over blocks of ranks, decided per sample and step (unset: none)."
    )

    @model_validator(mode="after")
    def _check_context_parallel(self) -> StepSpec:
        cp = self.context_parallel
        if cp is None:
            return self
        problems = Problems("StepSpec")
        if cp.size > self.ranks:
            problems.add(("context_parallel", "size"), f"must be at most ranks ({self.ranks})", cp.size)
        elif cp.mode != "free" and cp.size & (cp.size - 1):
            problems.add(("context_parallel", "size"), f"must be a power of two in {cp.mode} mode", cp.size)
        elif cp.mode == "static" and self.ranks % cp.size:
            problems.add(("context_parallel", "size"), f"must divide ranks ({self.ranks}) in static mode", cp.size)
        if cp.max_micro_batches is not None and cp.max_micro_batches < self.micro_batches:
            problems.add(
                ("context_parallel", "max_micro_batches"),
                f"must be at least micro_batches ({self.micro_batches})",
                cp.max_micro_batches,
            )
        if self.patches_per_micro_batch is not None:
            problems.add(
                ("context_parallel",), "cannot be set with patches_per_micro_batch (multimodal steps)", NO_VALUE
            )
        problems.raise_if_any()
        return self

    @property
    def longest_sample(self) -> int:
        """The longest sample a step holds: a micro-batch's tokens, or with context parallelism a block's."""
        cp = self.context_parallel
        return self.tokens_per_micro_batch if cp is None else cp.longest_sample(self.tokens_per_micro_batch)

    @property
    def tokens_per_step(self) -> int:
        """The step's capacity: ranks * micro_batches * tokens_per_micro_batch."""
        return self.ranks * self.micro_batches * self.tokens_per_micro_batch


_DIRECT = ("alpha", "beta")
_MODEL = ("hidden_size", "num_layers", "causal")
_VIT = ("hidden_size", "num_layers")


class VisionCostSpec(BaseModel):
    """Cost in the vision encoder of one image or clip of n patches, ``alpha * n**2 + beta * n + gamma``.

    Give ``alpha`` and ``beta`` (and ``gamma``, default 0), in the unit of the section around it, or the
    ViT's ``hidden_size`` and ``num_layers``, from which per layer ``4 * h`` FLOPs per pair of patches of
    one item (attention within each image or clip, not causal) and ``24 * h**2`` per patch; then the LLM's
    cost must be in FLOPs too (its ``hidden_size``/``num_layers``), since the scheduler adds the two.
    """

    model_config = ConfigDict(extra="forbid")

    alpha: float | None = Field(None, ge=0, allow_inf_nan=False, description="Cost per pair of patches of an item.")
    beta: float | None = Field(None, ge=0, allow_inf_nan=False, description="Cost per patch.")
    gamma: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="Cost per item, whatever its size; only with alpha/beta."
    )
    hidden_size: int | None = Field(None, ge=1)
    num_layers: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> VisionCostSpec:
        problems = Problems("VisionCostSpec")
        _check_one_form(self, problems, [k for k in (*_DIRECT, "gamma") if getattr(self, k) is not None], _VIT)
        problems.raise_if_any()
        return self

    def cost_model(self) -> VisionCostModel:
        """The encoder's ``VisionCostModel``: given, or ``VisionCostModel.from_vit``."""
        if self.alpha is not None and self.beta is not None:
            return VisionCostModel(float(self.alpha), float(self.beta), float(self.gamma or 0.0))
        return VisionCostModel.from_vit(self.hidden_size or 1, self.num_layers or 1)


def _check_one_form(section: BaseModel, problems: Problems, direct: list[str], shape: tuple[str, ...]) -> None:
    """The coefficients (``direct``: those given) or the model's ``shape`` fields, not both, and all that the
    form given needs."""
    model = [k for k in shape if getattr(section, k) is not None]
    if direct and model:
        problems.add(
            (),
            f"give either alpha/beta or {'/'.join(shape)}, not both",
            {k: getattr(section, k) for k in direct + model},
        )
    elif not direct and not model:
        problems.add((), "give alpha and beta, or hidden_size and num_layers")
    else:
        needed = _DIRECT if direct else shape[:2]
        with_ = "hidden_size/num_layers"
        if direct:
            with_ = "gamma" if direct == ["gamma"] else "alpha/beta"
        for key in needed:
            if getattr(section, key) is None:
                problems.add((key,), f"required with {with_}")


class CostSpec(BaseModel):
    """Cost of a sample of length L, ``alpha * L**2 + beta * L + gamma``, for balancing ranks.

    Give ``alpha`` and ``beta`` (and ``gamma``, default 0), as ``mixflow calibrate`` measures them on
    the training device, or the model's ``hidden_size`` and ``num_layers`` (and ``causal``, default
    true), from which per layer: attention scores and their product with the values cost ``4 * h``
    FLOPs per pair of tokens (half the pairs when causal), and the dense projections and MLP
    ``24 * h**2`` FLOPs per token. Only the ratios alpha : beta : gamma matter to the balance.
    """

    model_config = ConfigDict(extra="forbid")

    alpha: float | None = Field(None, ge=0, allow_inf_nan=False, description="Cost per pair of tokens.")
    beta: float | None = Field(None, ge=0, allow_inf_nan=False, description="Cost per token.")
    gamma: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="Cost per sample, whatever its length; only with alpha/beta."
    )
    hidden_size: int | None = Field(None, ge=1)
    num_layers: int | None = Field(None, ge=1)
    causal: bool | None = Field(None, description="Causal attention; default true.")
    vision: VisionCostSpec | None = Field(
        None, description="Cost of the images and clips in the vision encoder (unset: only the LLM's cost counts)."
    )
    context_parallel: ContextParallelCostSpec | None = Field(
        None,
        description="Cost of a sample split over a block of ranks, ring traffic included (unset: the defaults, "
        "where context-parallel steps are planned).",
    )

    @model_validator(mode="after")
    def _check(self) -> CostSpec:
        problems = Problems("CostSpec")
        _check_one_form(self, problems, [k for k in (*_DIRECT, "gamma") if getattr(self, k) is not None], _MODEL)
        if self.vision is not None and (self.vision.hidden_size is None) != (self.hidden_size is None):
            problems.add(
                ("vision",),
                "give the encoder's cost in the form of the LLM's (both alpha/beta, in one unit, or both "
                "hidden_size/num_layers, in FLOPs): the scheduler adds the two",
                self.vision.model_dump(exclude_none=True),
            )
        problems.raise_if_any()
        if self.hidden_size is not None and self.causal is None:
            self.causal = True
        return self

    def alpha_beta(self) -> tuple[float, float]:
        """``(alpha, beta)``: cost per token pair and per token, given or derived from the model's shape
        by ``CostModel.from_transformer``."""
        if self.alpha is not None and self.beta is not None:
            return float(self.alpha), float(self.beta)
        model = CostModel.from_transformer(self.hidden_size or 1, self.num_layers or 1, causal=self.causal is not False)
        return model.alpha, model.beta

    def cost_model(self) -> CostModel:
        """The scheduler's ``CostModel``: ``alpha_beta()`` and ``gamma`` (0 unless given)."""
        return CostModel(*self.alpha_beta(), gamma=float(self.gamma or 0.0))

    def context_parallel_cost(self) -> ContextParallelCost:
        """The ``ContextParallelCost`` of a block: this section's LLM FLOPs, and the ``context_parallel`` terms."""
        terms = self.context_parallel or ContextParallelCostSpec()
        hidden = self.hidden_size or terms.kv_heads * terms.head_dim
        return ContextParallelCost(
            model=self.cost_model(),
            layers=self.num_layers or 1,
            hidden_size=hidden,
            kv_heads=terms.kv_heads,
            head_dim=terms.head_dim,
            dtype_bytes=terms.dtype_bytes,
            flops_per_s=terms.tflops * 1e12,
            nvlink_bytes_per_s=terms.nvlink_gb_s * 1e9,
            network_bytes_per_s=terms.network_gb_s * 1e9,
            ranks_per_node=terms.ranks_per_node,
            gamma_s=terms.gamma_s,
        )

    def vision_cost_model(self) -> VisionCostModel | None:
        """The vision encoder's ``VisionCostModel``, or None without a ``vision`` section."""
        return None if self.vision is None else self.vision.cost_model()


class CompositionSpec(BaseModel):
    """Each step's samples are chosen from a look-ahead window of every source so that the step can be
    balanced (``pipeline/planning/mixing/compose.py``): long samples grouped so that every rank gets a fair share
    of their cost, short ones filling around them. A sample waits at most ``ceil(window_steps /
    due_share) - 1`` steps once in its source's window (63 with the defaults), plus ``ceil(2 * L / u)``
    where its source's longest sample ``L`` is longer than the source's tokens per step ``u``."""

    model_config = ConfigDict(extra="forbid")

    window_steps: float = Field(
        8.0, ge=1, le=64, allow_inf_nan=False, description="Steps of each source's share looked ahead."
    )
    due_share: float = Field(
        0.125,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Share of a step of each source taken from its head whatever the balance; bounds the wait.",
    )
    window_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="Most bytes of samples (tokens and media) the look-ahead holds, the sources sharing it by "
        "their weights: a source's window ends at window_steps or where its share runs out, never short of one "
        "step of its tokens. Bounds the constructor's memory where steps are large. Default: no byte limit.",
    )


RANKS_PER_TRANSACTION_STEP = 256
"""By default a transaction holds one more step per this many ranks."""


class ConstructorSpec(BaseModel):
    """How the job's steps are built: ``lanes`` constructors side by side, lane ``j`` building the steps
    ``k`` with ``k mod lanes == j`` from partition ``j`` of every source topic (``topics/formats/lanes.py``)."""

    model_config = ConfigDict(extra="forbid")

    lanes: int = Field(
        1, ge=1, le=256, description="Constructor lanes; source, rank and state topics get this many partitions."
    )
    steps_per_transaction: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Consecutive steps written in one transaction (a commit marks every rank topic it wrote, "
        "which dominates at a thousand ranks). Default: one per 256 ranks, rounded up, at most 16.",
    )

    max_lead_steps: int | None = Field(
        None,
        ge=1,
        description="Draw a step only while it is at most this many steps ahead of the slowest rank's trainer "
        "(as its sink reports on <job>.progress). Default: no limit, the constructor runs as far ahead as "
        "its sources allow.",
    )

    def transaction_steps(self, ranks: int) -> int:
        """Steps a transaction of a job of ``ranks`` ranks holds."""
        if self.steps_per_transaction is not None:
            return self.steps_per_transaction
        return min(16, -(-ranks // RANKS_PER_TRANSACTION_STEP))


class LongContextSpec(BaseModel):
    """A share of every step's tokens comes from samples of at least ``min_length`` tokens."""

    model_config = ConfigDict(extra="forbid")

    min_length: int = Field(ge=1, description="A sample of at least this many tokens is long.")
    token_share: float = Field(gt=0, lt=1, description="Share of each step's tokens from long samples.")


class OnExhausted(StrEnum):
    """What happens when a source has no more samples (after its epochs)."""

    STOP = "stop"
    """Stop the job at the first step the source cannot fill."""
    NEXT_EPOCH = "next_epoch"
    """Start another pass over the source; the step waits for it."""
    RENORMALIZE = "renormalize"
    """Give the source's share to the other sources, by their weights."""
