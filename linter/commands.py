"""What ``tmpl-lint diff``, ``replay`` and ``audit`` do, without printing any of it, as
``runner.py`` does for ``check``: options in, a typed result out; RunError and OptionsError
(from the runner) when the run cannot start. Apart from check's runner so that the lint
(every pre-commit run) does not import these commands' options and results."""

from __future__ import annotations

import functools
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checker import ProveOptions, source_engine
from .config import MAX_SLOTS
from .diff import diff_requests, read_template, template_in_force
from .engines import engine_for_cache, profile_of, reasoning_note, resolve_engine
from .engines.base import HARMONY, EngineError
from .findings import quoted_name
from .inputs import SourceError
from .isolation import IsolationError, run_isolated
from .offline import render_request
from .proving.measure import resolve_special_tokens
from .render import RenderError, RenderLimits, keep_compiled_code
from .report.progress import ProgressBar
from .requests import RequestError, read_request, reasoning_fields
from .runner import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, OptionsError, RunError, read_config
from .selection import Selection
from .sources import model_type_beside
from .tokenizer import TokenizerError, load_tokenizer

if TYPE_CHECKING:
    from .audit import Audit
    from .offline import Rendered
    from .proofs import Divergence
    from .replay.simulate import Summary


# --- tmpl-lint diff -----------------------------------------------------------------------


@dataclass(frozen=True)
class DiffOptions:
    first: Path
    second: Path
    template: Path | None = None  # a template file or model directory; None: the tokenizer's
    tokenizer: Path | None = None
    server: str | None = None
    model: str | None = None
    block_size: int | None = None  # None: the configuration's, else 16
    engine: str = "vllm"
    config_path: Path | None = None  # None: the nearest configuration to the working directory
    server_kwargs: dict[str, Any] | None = None  # the server's --default-chat-template-kwargs


def run_diff(options: DiffOptions, note: Callable[[str], None] = lambda text: None) -> tuple[Divergence, str]:
    """Where the second request stops extending the first, rendered as ``options.engine``
    would (or as a running vLLM tokenizes them), and what rendered them (an engine's
    label, or the server). ``note`` hears what the user should know (a model vLLM renders
    without the template, a served model replaced). Raises OptionsError or RunError."""
    from .server import ServerError, ServerURLError, VLLMServer  # noqa: PLC0415 -- urllib, ssl (14 ms): not render

    block_size, tokenizer = configured(options.config_path, options.block_size, options.tokenizer)
    try:
        vllm = VLLMServer(options.server, options.model, note) if options.server else None
    except ServerURLError as error:
        raise OptionsError(str(error)) from None
    try:
        first, second = read_request(options.first), read_request(options.second)
        said = reasoning_note(reasoning_fields(first.messages + second.messages), {}, options.engine)
        if said:
            note(said)
        template_source = options.template or tokenizer
        text, special = read_template(template_source) if template_source is not None else (None, {})
        if text is None and options.server is None:
            raise OptionsError("give --template or --tokenizer (a directory with a chat template), or --server")
        loaded = load_tokenizer(tokenizer) if tokenizer is not None else None
        if vllm is not None:
            vllm.discover(request.body.get("model") for request in (first, second))
        server_ids = vllm.prompt_token_ids if vllm is not None else None
        engine = options.engine
        if text is not None and template_source is not None:  # a text is read only from a template source
            engine = engine_for(options.engine, template_source, note)
        # Rendering is untrusted code: in a child with check's memory limit; each render has
        # its own time and size limits.
        arguments = (first, second, text, special, loaded, block_size, server_ids, engine, options.server_kwargs)
        divergence = run_isolated(_diff_or_error, (diff_requests, arguments), seconds=None)
        if isinstance(divergence, str):
            raise RequestError(divergence)
    except (RequestError, RenderError, ServerError, TokenizerError, EngineError) as error:
        raise RunError(str(error)) from None
    except IsolationError as error:
        raise RunError(f"diff stopped: {error}") from None
    return divergence, options.server or profile_of(engine).label


def configured(config_path: Path | None, block_size: int | None, tokenizer: Path | None) -> tuple[int, Path | None]:
    """The block size and tokenizer of a run: the flags', else the configuration's (as
    ``check`` takes them), else 16 and none. Raises RunError when the configuration cannot
    be read."""
    return read_config(config_path).layered(block_size, tokenizer)


def _diff_or_error(function, args):
    """``function(*args)``, or the message of the error it raised (to cross from the child)."""
    from .server import ServerError  # noqa: PLC0415 -- urllib, ssl (14 ms): not render

    try:
        return function(*args)
    except (RequestError, RenderError, ServerError, TokenizerError, EngineError) as error:
        return str(error)


def engine_for(engine: str, path: Path, note: Callable[[str], None], served: bool = False) -> str:
    """What renders requests for the model of ``path``, as check's proofs render it (a GGUF's
    template as llama.cpp does, unless ``served``: a running server of ``engine`` renders
    them), saying so when vLLM ignores the template."""
    source = template_in_force(path)
    resolved = resolve_engine(engine, source.text, model_type_beside(path)) if served else source_engine(engine, source)
    if resolved == HARMONY:
        note("vLLM renders this model (gpt-oss) with openai-harmony, not this template; --engine hf renders the template")
    return resolved


# --- tmpl-lint render ---------------------------------------------------------------------


@dataclass(frozen=True)
class RenderOptions:
    request: Path
    template: Path | None = None  # a template file, tokenizer_config.json or model directory
    tokenizer: Path | None = None
    engine: str = "vllm"
    config_path: Path | None = None
    server_kwargs: dict[str, Any] | None = None


class Refused(Exception):
    """The engine answers the request with an error (exit 2, one line)."""


def run_render(options: RenderOptions, note: Callable[[str], None] = lambda text: None) -> Rendered:
    """The request rendered and tokenized as ``options.engine`` would. Raises Refused (the
    engine's refusal, or the template's), OptionsError or RunError."""
    _block_size, tokenizer = configured(options.config_path, None, options.tokenizer)
    template_source = options.template or tokenizer
    if template_source is None:
        raise OptionsError("give --template or --tokenizer (a directory with a chat template)")
    try:
        request = read_request(options.request)
        text, special = read_template(template_source)
        loaded = load_tokenizer(tokenizer) if tokenizer is not None else None
        engine = engine_for(options.engine, template_source, note)
        # Rendering is untrusted code: in a child with check's memory limit.
        outcome = run_isolated(render_request, (engine, text, request.body, special, loaded, options.server_kwargs), seconds=None)
    except (RequestError, TokenizerError) as error:
        raise RunError(str(error)) from None
    except IsolationError as error:
        raise RunError(f"render stopped: {error}") from None
    if isinstance(outcome, str):
        raise Refused(f"{options.request}: {outcome}")
    return outcome


# --- tmpl-lint validate -------------------------------------------------------------------


@dataclass(frozen=True)
class ValidateOptions:
    log: Path
    server: str
    template: Path | None = None
    tokenizer: Path | None = None
    engine: str = "vllm"
    model: str | None = None
    deadline: float = 600.0  # seconds for the whole run
    config_path: Path | None = None
    server_kwargs: dict[str, Any] | None = None


@dataclass
class ValidateResult:
    validation: Any  # validate.Validation
    problems: list[str]  # the log's lines not read, each "LOG:LINE: why"
    decode: Callable[[list[int]], str] | None = None

    @property
    def status(self) -> int:
        if self.problems or self.validation.unanswered or self.validation.stopped:
            return EXIT_ERROR
        return EXIT_FINDINGS if self.validation.disagreements else EXIT_CLEAN


def run_validate(options: ValidateOptions, note: Callable[[str], None] = lambda text: None) -> ValidateResult:
    """Each logged request rendered offline by ``options.engine``'s profile and by the
    server, and the token ids compared. Raises OptionsError or RunError."""
    from . import validate  # noqa: PLC0415 -- validate's comparison: tmpl-lint validate only
    from .replay.log import ReplayError, read_log  # noqa: PLC0415 -- the log reader: validate and replay only
    from .server import LlamaServer, ServerError, ServerURLError, VLLMServer  # noqa: PLC0415 -- urllib, ssl (14 ms): not render

    _block_size, tokenizer = configured(options.config_path, None, options.tokenizer)
    template_source = options.template or tokenizer
    if template_source is None:
        raise OptionsError("give --template or --tokenizer (a directory with a chat template)")
    if options.engine not in ("vllm", "llamacpp"):
        raise OptionsError(f"--engine {options.engine}: no render endpoint to ask (vLLM's and llama-server's are)")
    try:
        llama = LlamaServer(options.server) if options.engine == "llamacpp" else None
        vllm = VLLMServer(options.server, options.model, note) if llama is None else None
    except ServerURLError as error:
        raise OptionsError(str(error)) from None
    try:
        with read_log(options.log) as log:  # every request is compared: all are read
            calls, unread = [log.call(entry) for entry in log.entries], log.problems
        if not calls and not unread:
            raise RunError(f"{options.log}: no requests to validate")
        text, special = read_template(template_source)
        loaded = load_tokenizer(tokenizer) if tokenizer is not None else None
        engine = engine_for(options.engine, template_source, note, served=True)
        calls.sort(key=lambda call: call.line)
        bodies = [call.body for call in calls]
        offline = run_isolated(validate.offline_answers, (engine, text, bodies, special, loaded, options.server_kwargs))
        # The server's part of the run, each request within what is left of it.
        ends_at = time.monotonic() + options.deadline
        server = llama or vllm
        assert server is not None, "validate asks one server"
        server.ends_at = ends_at
        if llama is not None:
            ask, base_url = (lambda body: validate.Answer(text=llama.prompt_text(body))), llama.base_url
        else:
            assert vllm is not None
            vllm.discover(body.get("model") for body in bodies)
            ask, base_url = (lambda body: validate.Answer(ids=tuple(vllm.prompt_token_ids(body)))), vllm.base_url
        answered, unanswered, stopped = validate.ask_server(ask, [call.line for call in calls], bodies, options.deadline, ends_at)
    except (ReplayError, RequestError, TokenizerError) as error:
        raise RunError(str(error)) from None
    except ServerError as error:
        raise RunError(str(error)) from None
    except IsolationError as error:
        raise RunError(f"validate stopped: {error}") from None
    mine = {call.line: answer for call, answer in zip(calls, offline)}
    validation = validate.Validation(profile_of(engine).label, base_url, len(calls) + len(unread))
    validation.checks = [validate.Check(line, mine[line], theirs) for line, theirs in answered]
    validation.unanswered, validation.stopped = unanswered, stopped
    decode = (lambda ids: loaded.backend.decode(ids, skip_special_tokens=False)) if loaded is not None else None
    return ValidateResult(validation, [str(problem) for problem in unread], decode)


# --- tmpl-lint replay ---------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    log: Path
    template: Path | None  # a template file or model directory; None: the tokenizer's
    compare: Path | None = None  # a second template replayed on the same cache
    tokenizer: Path | None = None
    session_key: str | None = None
    server: str | None = None
    model: str | None = None
    engine: str | None = None  # None: vllm, or sglang with --cache-model sglang
    cache_model: str | None = None  # None: the engine's
    block_size: int | None = None  # None: the configuration's, else 16
    cache_blocks: str | None = None  # "N[,N...]": several sizes sweep the hit-rate curve
    kv_cache_gib: float | None = None
    model_config: Path | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    slots: int | None = None
    cache_reuse: int = 0
    jobs: int = 1
    replicas: int = 1
    router: str | None = None  # None: round-robin
    config_path: Path | None = None  # None: the nearest configuration to the working directory
    server_kwargs: dict[str, Any] | None = None  # the server's --default-chat-template-kwargs
    api_model: str | None = None  # a hosted API's model (--cache-model anthropic or gemini)
    cache_ttl: float | None = None  # seconds a hosted API's cache lives after its last use
    cluster: str | None = None  # a Dask scheduler's address: the stages run on its workers

    def described(self) -> str:
        """The options that decide the figures, as a command line would give them; the
        engine and cache model as the run resolved them (each defaults to the other's)."""
        from .kv_cache.hosted import HOSTED_MODELS  # noqa: PLC0415 -- replay's pipeline (0.1 s)

        hosted = self.cache_model in HOSTED_MODELS
        engine, cache_model = engine_for_cache(self.engine, None if hosted else self.cache_model)
        given = [
            ("--template", self.template),
            ("--compare", self.compare),
            ("--tokenizer", self.tokenizer),
            ("--session-key", self.session_key),
            ("--server", self.server),
            ("--model", self.model),
            ("--engine", engine),
            ("--cache-model", self.cache_model if hosted else cache_model),
            ("--api-model", self.api_model),
            ("--cache-ttl", self.cache_ttl),
            ("--block-size", self.block_size),
            ("--cache-blocks", self.cache_blocks),
            ("--kv-cache-gib", self.kv_cache_gib),
            ("--model-config", self.model_config),
            ("--num-layers", self.num_layers),
            ("--num-kv-heads", self.num_kv_heads),
            ("--head-dim", self.head_dim),
            ("--kv-cache-dtype", None if self.kv_cache_dtype == "auto" else self.kv_cache_dtype),
            ("--page-size", None if self.page_size == 1 else self.page_size),
            ("--slots", self.slots),
            ("--cache-reuse", self.cache_reuse or None),
            ("--replicas", None if self.replicas == 1 else self.replicas),
            ("--router", self.router),
            ("--default-chat-template-kwargs", json.dumps(self.server_kwargs) if self.server_kwargs else None),
        ]
        return " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in given if value is not None)


@dataclass
class ReplayResult:
    summaries: list[tuple[str, Summary]]  # ("template", ...) and, with --compare, ("compare", ...)
    problems: list[str]  # the log's lines not replayed, each said once: "LOG:LINE: why"
    files: dict[str, str] = field(default_factory=dict)  # label -> the template's file, as given

    def named(self) -> list[tuple[str, Summary]]:
        """The summaries under their templates' file names."""
        return [(self.files.get(label, label), summary) for label, summary in self.summaries]

    @property
    def status(self) -> int:
        return EXIT_ERROR if self.problems else EXIT_CLEAN


def run_replay(options: ReplayOptions, note: Callable[[str], None] = lambda text: None) -> ReplayResult:
    """The log through the cache model, once per template. ``note`` hears what the user
    should know as it is found. Raises OptionsError or RunError."""
    from .cluster import ClusterError, address_problem, cluster_address, replay_on_cluster  # noqa: PLC0415 -- --cluster only
    from .kv_cache import pools  # noqa: PLC0415 -- replay's pipeline (0.1 s)
    from .kv_cache.hosted import HOSTED_MODELS  # noqa: PLC0415 -- replay's pipeline (0.1 s)
    from .replay.attribution import Tracer  # noqa: PLC0415 -- replay's pipeline (0.1 s)
    from .replay.log import ReplayError, read_log, sessions  # noqa: PLC0415 -- replay's pipeline (0.1 s)
    from .replay.simulate import CacheSettings, replay  # noqa: PLC0415 -- replay's pipeline (0.1 s)
    from .replay.tracing import TemplateError  # noqa: PLC0415 -- replay's pipeline (0.1 s)
    from .server import ServerError, ServerURLError, VLLMServer  # noqa: PLC0415 -- urllib, ssl (14 ms): not render

    hosted = options.cache_model in HOSTED_MODELS
    engine, cache_model = engine_for_cache(options.engine, None if hosted else options.cache_model)
    if hosted:
        cache_model = str(options.cache_model)  # one of HOSTED_MODELS
        if options.cache_blocks is not None or options.kv_cache_gib is not None:
            raise OptionsError(f"--cache-model {cache_model} is a hosted API's cache: it has no --cache-blocks or --kv-cache-gib")
        if options.replicas != 1:
            raise OptionsError(f"--cache-model {cache_model} is a hosted API's cache: it has no --replicas to route between")
    elif options.api_model is not None or options.cache_ttl is not None:
        flag = "--api-model" if options.api_model is not None else "--cache-ttl"
        raise OptionsError(f"{flag} is a hosted API's: it needs --cache-model {'|'.join(HOSTED_MODELS)}")
    cluster = cluster_address(options.cluster)
    if cluster is not None and options.server:
        raise OptionsError("--cluster renders on the workers: it cannot take --server's token ids")
    if cluster is not None:
        try:
            problem = address_problem(cluster)
        except ImportError:  # said when the run reaches the cluster, with the extra to install
            problem = None
        if problem:
            raise RunError(f"--cluster {cluster}: {problem}")
    # A flag of another engine's cache would be read as if it changed these figures.
    if options.page_size != 1 and cache_model != "sglang":
        raise OptionsError("--page-size is SGLang's page size: it needs --cache-model sglang")
    if options.slots is not None and not 1 <= options.slots <= MAX_SLOTS:
        raise OptionsError(f"--slots {options.slots} is not in the range 1 to {MAX_SLOTS}")
    if (options.slots is not None or options.cache_reuse) and cache_model != "llamacpp":
        flag = "--slots" if options.slots is not None else "--cache-reuse"
        raise OptionsError(f"{flag} is llama.cpp's: it needs --cache-model llamacpp")
    if options.router is not None and options.replicas == 1:
        raise OptionsError("--router chooses between replicas: it needs --replicas N (more than 1)")
    block_size, tokenizer = configured(options.config_path, options.block_size, options.tokenizer)
    template = options.template or tokenizer
    if template is None:
        raise OptionsError("give --template or --tokenizer (a directory with a chat template)")
    try:
        vllm = VLLMServer(options.server, options.model, note) if options.server else None
    except ServerURLError as error:
        raise OptionsError(str(error)) from None
    try:
        shape, layout = None, None
        config = pools.read_model_config(options.model_config) if options.model_config else None
        if config is not None:
            from .kv_cache.hybrid import read_layout  # noqa: PLC0415 -- replay's pipeline: replay of a hybrid model only

            layout = read_layout(config, block_size)
            if not layout.hybrid:
                layout = None
            elif cache_model != "vllm":
                raise OptionsError("the model's sliding-window or Mamba layers are modelled for vLLM only (--cache-model vllm)")
        if layout is not None and options.kv_cache_gib is not None:
            raise OptionsError(
                "--kv-cache-gib sizes pages of full attention; a hybrid model's pages differ per group: "
                "give --cache-blocks (the num_gpu_blocks vLLM logs at start)"
            )
        if options.kv_cache_gib is not None and options.cache_blocks is None:  # both: capacities says so
            shape = pools.kv_shape(config, options.kv_cache_dtype, options.num_layers, options.num_kv_heads, options.head_dim)
        capacities = pools.capacities(options.cache_blocks, options.kv_cache_gib, block_size, shape)
        if cache_model == "llamacpp" and capacities != [None] and not options.slots:
            raise OptionsError("with --cache-model llamacpp a capacity is split over --slots N; give --slots")
        settings = CacheSettings(
            cache_model,
            block_size,
            options.page_size,
            options.slots,
            options.cache_reuse,
            replicas=options.replicas,
            router=options.router or "round-robin",
            layout=layout,
            api_model=options.api_model,
            ttl=options.cache_ttl,
        )
        with read_log(options.log, options.session_key) as log:
            if not log.entries and not log.problems:  # (lines that are not requests are each an error of their own)
                raise RunError(f"{options.log}: no requests to replay")
            loaded = load_tokenizer(tokenizer) if tokenizer else None
            templates = [("template", template, *read_template(template))]
            if options.compare:
                templates.append(("compare", options.compare, *read_template(options.compare)))
            if vllm is not None:
                vllm.discover(log.models)
            server_ids = vllm.prompt_token_ids if vllm is not None else None
            groups = sessions(log, options.session_key)
            said = reasoning_note(log.requests_carry, log.replies_carry, engine)
            if said:
                note(said)
            summaries: list[Any] = []
            failed: list[str] = []
            for label, path, text, special in templates:
                renderer = engine_for(engine, path, note)
                tracer = Tracer(
                    text, loaded, resolve_special_tokens(loaded, special), renderer, server_ids, options.server_kwargs
                )
                tracer.marks = cache_model == "anthropic"
                jobs = 1 if options.server else options.jobs
                try:
                    if cluster is not None:
                        summary, refused = replay_on_cluster(cluster, tracer, log, groups, settings, capacities)
                    else:
                        bar = functools.partial(ProgressBar, f"replaying {quoted_name(path)}")
                        summary, refused = replay(tracer, log, groups, settings, capacities, jobs, bar)
                except TemplateError as error:  # said once, not for every request
                    raise RunError(f"{quoted_name(path)}: {error}") from None
                summary.engine = profile_of(renderer).label
                summaries.append((label, summary))
                # With --compare two templates replay the same lines: the line says whose failure it is.
                whose = f"{quoted_name(path)}: " if options.compare else ""
                failed.extend(f"{options.log}:{line}: {whose}{reason}" for line, reason in refused)
            unread = log.problems
    except (ReplayError, RequestError, ServerError, TokenizerError, pools.CacheError, ClusterError) as error:
        raise RunError(str(error)) from None
    except IsolationError as error:
        raise RunError(f"replay stopped: {error}") from None
    files = {label: quoted_name(path) for label, path, *_ in templates}
    return ReplayResult(summaries, list(dict.fromkeys([*map(str, unread), *failed])), files)


# --- tmpl-lint audit ----------------------------------------------------------------------


@dataclass(frozen=True)
class AuditOptions:
    repo_ids: tuple[str, ...] = ()  # org/name[@revision]
    local: tuple[Path, ...] = ()  # model folders
    from_file: Path | None = None  # repo ids, one a line
    search: str | None = None  # a Hub search query
    author: str | None = None
    limit: int = 50  # models --search/--author lists
    from_cache: bool = False  # every model in the local Hugging Face cache
    jobs: int = 1
    tokens: bool = False
    prove: bool = True
    dedupe: bool = True
    cache_file: Path | None = None  # None: the default results cache
    use_cache: bool = True
    engine: str = "vllm"
    config_path: Path | None = None  # its block-size is the engine's; None: the nearest configuration


@dataclass
class AuditRun:
    audit: Audit
    rows: list[dict[str, Any]]  # one a template, or a repo without one
    cache_problems: list[str]  # a results cache that could not be read or written

    @property
    def status(self) -> int:
        """2 when a repo or the cache could not be read, or no repo had a template; else 1
        when a template has a finding that fails the run (as check decides it), else 0."""
        if any(repo.error for repo in self.audit.repos) or self.cache_problems or not self.audit.analyses:
            return EXIT_ERROR
        failing = any(finding.get("fails") for row in self.rows for finding in row.get("findings", ()))
        return EXIT_FINDINGS if failing else EXIT_CLEAN


def run_audit(options: AuditOptions, advance: Callable[[], None] | None = None) -> AuditRun:
    """Audit the repos and folders ``options`` names; ``advance`` is called as each template
    is analysed. Raises OptionsError or RunError."""
    from . import audit as auditing  # noqa: PLC0415 -- audit's pipeline: audit only
    from .report.audit import rows  # noqa: PLC0415 -- audit's pipeline: audit only

    block_size, _ = configured(options.config_path, None, None)
    keep_compiled_code(options.use_cache)
    repo_ids = list(options.repo_ids)
    try:
        if options.from_file:
            repo_ids += auditing.read_repo_list(options.from_file)
        if options.search or options.author:
            from huggingface_hub import list_models  # noqa: PLC0415 -- an extra (audit), 0.3 s: --search and --author only

            repo_ids += [model.id for model in list_models(search=options.search, author=options.author, limit=options.limit)]
    except SourceError as error:
        raise RunError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - a hub listing failure is one line
        raise RunError(f"cannot list models: {auditing.describe_error(error)}") from None
    if not (repo_ids or options.local or options.from_cache):
        raise OptionsError("name repos, --from-file, --search/--author, --from-cache or local model folders")
    prove = ProveOptions(None, block_size, RenderLimits(), options.engine) if options.prove else None
    cache = auditing.ResultsCache((options.cache_file or auditing.default_cache_path()) if options.use_cache else None)
    try:
        audit = auditing.run_audit(
            repo_ids,
            list(options.local),
            options.from_cache,
            Selection(),
            prove,
            options.jobs,
            cache,
            options.tokens,
            options.dedupe,
            advance,
        )
    except auditing.NoHubCache as error:  # raised before anything is fetched or analysed
        raise RunError(str(error)) from None
    return AuditRun(audit, rows(audit), cache.problems)
