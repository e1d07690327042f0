"""Render a host's service: the systemd unit and the server's `--config` YAML, from `templates/`.

The unit template is the profile's `template`; the config template, when the templates directory
has one, is the same stem with `.config.yaml.j2` (e.g. `sglang-ddtree.service.j2` ->
`sglang-ddtree.config.yaml.j2`). Values are computed here, in Python, so templates stay declarative
and every value that reaches a unit file goes through the systemd quoting filters.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ddtreectl.errors import TemplateError
from ddtreectl.inventory.models import Host, Inventory, ServiceProfile
from ddtreectl.render.environment import make_environment
from ddtreectl.render.quoting import exec_line

UNIT_DIR = "/etc/systemd/system"
ScalarValue = str | int | float | bool


@dataclass(frozen=True)
class RenderedFile:
    """One file to install on a host."""

    path: str  # absolute path on the host
    content: str
    mode: int = 0o644

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()


@dataclass(frozen=True)
class RenderedService:
    """Everything ddtreectl installs for one host's service, plus what the running server must report."""

    host: str
    unit: str  # e.g. "sglang-k26-ddtree.service"
    files: tuple[RenderedFile, ...]
    server_args: Mapping[str, ScalarValue] = field(default_factory=dict)
    env_file: str = ""  # secrets: mode 0600, owned by the operator, never rendered or shown

    @property
    def unit_file(self) -> RenderedFile:
        return next(f for f in self.files if f.path.endswith(".service"))


# The templates of the checkout this ddtreectl runs from (the repository's top-level templates/).
BUNDLED_TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def templates_dir_for(inventory: Inventory) -> Path:
    """`templates/` beside the inventory, else the templates bundled with this checkout: the same rule
    as the engine (`deploy --engine`'s default), so an inventory kept outside the checkout (`-i
    ~/fleet/hosts.yaml`) renders with the bundled templates instead of failing on a directory that
    does not exist. A `templates/` beside the inventory wins whole (no per-file mixing)."""
    beside = inventory.path.resolve().parent / "templates"
    return beside if beside.is_dir() or not BUNDLED_TEMPLATES.is_dir() else BUNDLED_TEMPLATES


def _not_found_hint(service: ServiceProfile, template: str, templates: Path) -> str:
    """Exactly what to copy where (or which key to fix) for a template that is not there."""
    bundled = BUNDLED_TEMPLATES / template
    if not templates.is_dir():
        return (f"create {templates} and put {template} in it (the bundled templates are the templates/ "
                f"directory of a ddtreectl checkout), or fix services.{service.name}.template")
    if bundled.is_file() and bundled.parent != templates:
        return (f"{templates} overrides the bundled templates whole: copy {bundled} into {templates}/ "
                f"(`cp {bundled} {templates}/`), or fix services.{service.name}.template")
    have = sorted(p.name for p in templates.glob("*.service.j2"))
    return (f"services.{service.name}.template names a file under {templates}"
            + (f" (there: {', '.join(have)})" if have else " (it has no *.service.j2)"))


def _rank_of(inventory: Inventory, host: Host, service: ServiceProfile) -> tuple[int, int, str]:
    """(node rank, node count, dist-init address) for a multi-node profile; (0, 1, "") otherwise."""
    if not service.nodes:
        return 0, 1, ""
    if host.name not in service.nodes:
        raise TemplateError(
            f"host {host.name!r} runs service {service.name!r} but is not one of its nodes "
            f"({', '.join(service.nodes)})",
            hint=f"add {host.name} to services.{service.name}.nodes or change hosts.{host.name}.service",
            host=host.name,
        )
    rank0 = inventory.hosts[service.nodes[0]]
    return service.nodes.index(host.name), len(service.nodes), f"{rank0.address}:{service.dist_init_port}"


def server_args(inventory: Inventory, host: Host, service: ServiceProfile) -> dict[str, ScalarValue]:
    """The server's arguments (SGLang long-form names), in the order they are written to the config."""
    args: dict[str, ScalarValue] = {
        "model-path": service.model_path,
        "served-model-name": service.served_model_name,
        "tp-size": service.tp_size,
        "host": "0.0.0.0",
        "port": service.port,
    }
    for key, value in service.speculative.items():
        name = key.replace("_", "-")
        args[name if name.startswith("speculative-") else f"speculative-{name}"] = value
    rank, nnodes, dist_init_addr = _rank_of(inventory, host, service)
    if nnodes > 1:
        args.update({"nnodes": nnodes, "node-rank": rank, "dist-init-addr": dist_init_addr})
    return args


def _environment(service: ServiceProfile) -> dict[str, str]:
    env = dict(service.environment)
    if service.nccl_interface:
        env.setdefault("NCCL_SOCKET_IFNAME", service.nccl_interface)
        env.setdefault("GLOO_SOCKET_IFNAME", service.nccl_interface)
    return env


def render_service(
    inventory: Inventory, host: Host, templates_dir: Path | None = None
) -> RenderedService | None:
    """Render the unit (and config) the host's service profile asks for; None if it runs no service."""
    import jinja2

    service = inventory.service_of(host)
    if service is None:
        return None
    templates = templates_dir or templates_dir_for(inventory)
    env = make_environment(templates)
    unit_stem = service.unit_name or service.name
    config_path = posixpath.join(host.remote_root, "config", f"{unit_stem}.yaml")
    env_file = posixpath.join(host.remote_root, "state", f"{unit_stem}.env")
    args = server_args(inventory, host, service)
    config_template = service.template.removesuffix(".service.j2") + ".config.yaml.j2"
    has_config = (templates / config_template).is_file() and not service.exec_start
    if service.exec_start:
        exec_start = service.exec_start
    else:
        argv = [service.python, "-m", service.module]
        argv += ["--config", config_path] if has_config else []
        exec_start = exec_line(argv + list(service.extra_args))
    context = {
        "host": host,
        "service": service,
        "unit_name": unit_stem,
        "exec_start": exec_start,
        "environment": _environment(service),
        "env_file": env_file,
        "working_directory": posixpath.join(host.remote_root, "current"),
        "server_args": args,
        "config_path": config_path,
        "rank": args.get("node-rank", 0),
        "nnodes": args.get("nnodes", 1),
    }
    files: list[RenderedFile] = []
    for template_name, path in [(service.template, posixpath.join(UNIT_DIR, service.unit))] + (
        [(config_template, config_path)] if has_config else []
    ):
        try:
            content = env.get_template(template_name).render(context)
        except jinja2.TemplateNotFound:
            raise TemplateError(
                f"template {template_name!r} not found in {templates}",
                hint=_not_found_hint(service, template_name, templates),
                host=host.name,
            ) from None
        except jinja2.UndefinedError as err:
            raise TemplateError(
                f"rendering {template_name} for service {service.name!r}: {err.message}",
                hint="define it in the inventory (service profile or host) or fix the template",
                host=host.name,
            ) from None
        except jinja2.TemplateSyntaxError as err:
            raise TemplateError(
                f"{template_name}:{err.lineno}: {err.message}", hint="fix the template", host=host.name
            ) from None
        except ValueError as err:  # a value that cannot be written into a unit (line break, NUL)
            raise TemplateError(f"rendering {template_name}: {err}", host=host.name) from None
        files.append(RenderedFile(path=path, content=content))
    return RenderedService(host=host.name, unit=service.unit, files=tuple(files), server_args=args, env_file=env_file)
