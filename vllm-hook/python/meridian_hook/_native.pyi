"""Typed surface of the Rust extension ``meridian_hook._native``."""

from collections.abc import Iterable
from types import ModuleType
from typing import Any

class _Kernels(ModuleType):
    """`meridian-kernels` (see kernels/README.md): pointers in, results written to
    caller-owned buffers, CUDA work on the caller's stream."""

    class KernelUnavailableError(RuntimeError): ...
    MAX_TOP_K: int
    @staticmethod
    def entropy(
        data_ptr: int, dtype: str, shape: tuple[int, int], stream: int, out_ptr: int,
        temperature: float = 1.0, device: str = "cuda", threads: int = 0,
    ) -> None: ...
    @staticmethod
    def topk_entropy(
        data_ptr: int, dtype: str, shape: tuple[int, int], k: int, stream: int, out_ptr: int,
        temperature: float = 1.0, device: str = "cuda", threads: int = 0,
    ) -> None: ...
    @staticmethod
    def eat_update(
        x_ptr: int, active_ptr: int, ema_ptr: int, variance_ptr: int, steps_ptr: int, stop_ptr: int,
        batch: int, alpha: float, delta: float, warmup_steps: int, stream: int, device: str = "cuda",
    ) -> None: ...
    @staticmethod
    def cuda_unavailable_reason() -> str | None: ...
    @staticmethod
    def abi_version() -> int: ...

kernels: _Kernels

__version__: str
PROTOCOL_VERSION: int

class SchedulerCore:
    """Orders vLLM's running list by a meridian-core policy (victim last)."""

    def __init__(
        self, policy: str, think_start: list[int], think_end: list[int], step_budget: int | None = None
    ) -> None:
        """step_budget: vLLM's max_num_batched_tokens (the policy's prefill cap is a share of it)."""
    @property
    def policy_name(self) -> str: ...
    def track(self, request_id: str, prompt: list[int]) -> None: ...
    def knows(self, request_id: str) -> bool: ...
    def order(self, rows: list[tuple[str, float, int, int, list[int]]]) -> list[int]:
        """rows: (request_id, arrival_time, priority, prefill_remaining, new_output_tokens)."""
    def plan(
        self, rows: list[tuple[str, float, int, int, list[int]]]
    ) -> tuple[list[int], int | None, int | None]:
        """Like ``order``, plus the step's (max_prefill_tokens, max_think_decodes)."""
    def plan_running(
        self, running: list[Any], oldest_waiting_start: float | None = None
    ) -> tuple[list[int] | None, int | None, int | None, list[int] | None, int | None]:
        """From vLLM's running ``Request`` objects: (order or None to keep vLLM's,
        max_prefill_tokens, max_think_decodes, positions held out of the step or None,
        the step's token budget or None for vLLM's own: one token per decoding request
        plus the prefill cap, the prefilling requests ordered after the decoding ones).
        ``oldest_waiting_start``: the ``arrival_time`` of the request that has waited
        longest in vLLM's queue without generating a token (None: none waits)."""
    def observe_outputs(self, running: list[Any], waiting: int | None = None) -> None:
        """After vLLM's ``update_from_output``: reads the new output tokens of the running
        requests the last ``plan_running`` call read (the next call then skips them), and
        publishes the running requests by phase and the waiting queue's length (the hello's
        ``engine``, ``meridian_hook_requests``)."""
    def count_free_blocks(self, free: int) -> None:
        """Publishes the KV cache's free blocks (``meridian_hook_kv_free_blocks``)."""
    def phase(self, request_id: str) -> str: ...
    def preempted(self, request_id: str) -> str:
        """Counts a preemption; returns the victim's KV tier."""
    def first_dead_block(self, request_id: str, prompt_tokens: int, block_size: int) -> int | None:
        """The first KV block of a finishing request no later request can hit (from the
        block holding its prompt's end on, when it thought); None when it did not think."""
    def demoted(self, blocks: int) -> None: ...
    def account_kv(self, held: list[tuple[str, int]], block_size: int) -> list[int]: ...
    def account_kv_running(self, tables: list[dict[str, Any]], block_size: int) -> list[int]:
        """``account_kv`` for the last ``plan_running`` call's requests, blocks counted in
        vLLM's per-group ``req_to_blocks`` tables."""
    def retain(self, live: Iterable[str]) -> None: ...
    def tracked(self) -> int: ...
    @staticmethod
    def kv_tiers() -> list[str]: ...

class ExitController:
    """Decides which batch rows must emit the end-of-thinking token now."""

    def __init__(
        self,
        think_start: list[int],
        think_end: list[int],
        signal: str = "off",
        min_think_tokens: int = 256,
        rpdi_window: int = 512,
        rpdi_lambda: float = 2.0,
        default_budget: int | None = None,
        use_directives: bool = True,
    ) -> None: ...
    def replay(self, slot: int, tokens: list[int]) -> None: ...
    def add(self, slot: int, prompt: list[int], request_id: str | None = None, budget: int | None = None) -> None: ...
    def reset_prompt(self, slot: int, prompt: list[int]) -> None: ...
    def remove(self, slot: int) -> None: ...
    def moved(self, from_: int, to: int) -> None: ...
    def swapped(self, a: int, b: int) -> None: ...
    def observe(self, rows: list[tuple[int, int, list[int]]]) -> list[int]:
        """rows: (row, slot, new_tokens); returns the rows now thinking."""
    def watch(self, slot: int, output: list[int]) -> None:
        """The slot's output token list, read by ``observe_outputs`` (vLLM V1)."""
    def observe_outputs(self, n_rows: int) -> list[int]:
        """``observe`` from the watched lists: slot = row, for slots below ``n_rows``."""
    def observe_rows(
        self, slots: list[int], seq_lens: list[int], prompt_lens: list[int], prefill_lens: list[int]
    ) -> list[int] | None:
        """Model Runner V2: the batch by row; None when no row samples, else the rows whose
        fed token is new, counted now and unread until ``observe_late`` brings its value."""
    def observe_batch(self, columns: bytes) -> int | None:
        """``observe_rows`` from its four columns packed as native-endian int64, one after
        the other; returns None when no row samples, else how many rows' fed tokens are
        new (their values: ``observe_late_fed``)."""
    def observe_late(self, tokens: list[int]) -> None:
        """The fed tokens of the oldest unread batch (the rows ``observe_rows`` returned
        that step), in order; values for a slot that changed hands are dropped."""
    def observe_late_fed(self, fed: bytes) -> None:
        """``observe_late`` from every row's fed token that step (native-endian int64);
        the rows counted unread are picked by the controller."""
    def thinking_rows(self) -> list[int]:
        """The rows of the last ``observe_rows`` that think, as far as the values read tell."""
    def entropies_later(self) -> list[int]:
        """This step's thinking rows, whose entropies ``entropies_arrived`` brings later."""
    def entropies_arrived(self, entropies: list[float]) -> None: ...
    def entropies_arrived_all(self, entropies: bytes) -> None:
        """``entropies_arrived`` from every row's entropy that step (native-endian float64)."""
    def epoch(self, slot: int) -> int | None:
        """Which occupant a slot holds (slots are reused)."""
    def set_seen(self, slot: int, seen: int) -> None: ...
    def decide(self, entropies: list[float]) -> list[tuple[int, int]] | None:
        """(row, token_id) pairs to force; None when a row's exit hinges on an unread
        value (read them all, ``thinking_rows``, then decide again)."""
    def phase(self, slot: int) -> str | None: ...
    def think_tokens(self, slot: int) -> int | None: ...

class Eat:
    def __init__(self, alpha: float = 0.2, delta: float = 1e-4, warmup_steps: int = 4) -> None: ...
    def update(self, entropy: float) -> tuple[float, float, bool]: ...

def load_config(path: str | None = None) -> dict[str, Any]: ...
def family_markers(served_model: str) -> tuple[str, list[int], list[int]] | None: ...
def phase_after(start: list[int], end: list[int], prompt: list[int], output: list[int]) -> str:
    """``"pending"``, ``"think"`` or ``"output"``: the phase of a request that generated
    ``output`` after ``prompt``, by the phase rule the proxy and the hook follow."""
def entropy_bounds(logprobs: list[float], vocab: int) -> tuple[float, float, float, float]: ...
def start_listener(listen: str, token_env: str, policy: str, entropy: bool, can_end_thinking: bool) -> str: ...
def start_follower(listen: str, token_env: str, worker: str) -> bool: ...
def channel_role() -> str | None: ...
def set_can_end_thinking(can: bool) -> None: ...
def set_disabled(disabled: bool) -> None:
    """Marks the hook disabled in this process (an unsupported vLLM, `hook.on_unsupported_vllm = "disable"`): `meridian_hook_disabled` reads 1 and the hello reports policy `disabled`."""
def stop_channel() -> None: ...
def apply_directive(json: str) -> int: ...
def count_error(site: str) -> None: ...
def render_metrics() -> str: ...
