"""A drill against a real deployment: the operator's own kill and start commands.

Owns ``CommandPair``: the two nodes named by ``--primary P --standby S`` (their
addresses, nothing else is assumed about where or how they run), and the two shell
commands the operator supplies, run with ``/bin/sh -c`` after substitution:

- ``{node}``: ``primary`` or ``standby`` -- the flag that named the node at the start
  (its identity: after a failover the node named ``primary`` may be the standby), or
  ``witness`` for ``--kill witness``;
- ``{address}``, ``{host}``, ``{port}``: that node's address (empty for the witness);
- ``{role}``: start command only: ``primary`` or ``standby``, the role to start it in
  (empty with ``--auto``: the witness decides);
- ``{primary}``: start command only: the address of the primary the node must follow
  when started as a standby (empty otherwise).

Each value is shell-quoted where it is substituted; ``{{``/``}}`` are literal braces.
Example (systemd)::

    --kill-cmd  'ssh {host} sudo systemctl kill --signal=KILL pagesift'
    --start-cmd 'ssh {host} sudo pagesift-start --role {role} --primary {primary}'

A command must return once its work is done (a start command starts the node in the
background, as ``systemctl start`` or ``kubectl`` do); it runs in its own process
group with its output appended to a log under the drill's working directory, is
waited for at most ``command_timeout`` seconds (then its group is killed and the
drill stops: exit 2), and a non-zero exit status stops the drill the same way. The
drill touches nothing else of the deployment: it calls the pagesift API (one crawl
and a few probing batch jobs per run, under the ``--api-key`` account; ``Promote``
without ``--auto``) and runs these two commands.
"""

from __future__ import annotations

import asyncio
import shlex
import string
from pathlib import Path

from pagesift.core.util.children import Child
from pagesift.drill.choices import FIELDS
from pagesift.drill.fixture import WITNESS, SetupError


def placeholders(template: str) -> set[str]:
    """The ``{names}`` used in ``template`` (ValueError for a malformed one)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def check_template(flag: str, template: str) -> None:
    """SetupError for an unknown placeholder or a malformed template."""
    try:
        used = placeholders(template)
    except ValueError as err:
        raise SetupError(f"{flag}: {err}") from None
    unknown = sorted(used - FIELDS)
    if unknown:
        known = ", ".join("{" + f + "}" for f in sorted(FIELDS))
        raise SetupError(f"{flag}: unknown placeholder {{{unknown[0]}}} (known: {known})")


def render(template: str, values: dict[str, str]) -> str:
    """``template`` with every placeholder replaced by its shell-quoted value."""
    quoted = {k: shlex.quote(v) if v else "''" for k, v in values.items()}
    return template.format_map(quoted)


def split_address(address: str) -> tuple[str, str]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


class CommandPair:
    """The deployment's two nodes, killed and started by the operator's commands."""

    def __init__(
        self,
        primary: str,
        standby: str,
        *,
        kill_cmd: str,
        start_cmd: str,
        auto: bool,
        workdir: Path,
        command_timeout: float = 120.0,
    ) -> None:
        check_template("--kill-cmd", kill_cmd)
        check_template("--start-cmd", start_cmd)
        self.names = {primary: "primary", standby: "standby"}
        self.kill_cmd = kill_cmd
        self.start_cmd = start_cmd
        self.auto = auto
        self.workdir = workdir
        self.command_timeout = command_timeout
        self._count = 0

    @property
    def addresses(self) -> list[str]:
        return list(self.names)

    def label(self, address: str) -> str:
        return f"{self.names.get(address, address)} ({address})"

    def _values(self, target: str, role: str, primary: str) -> dict[str, str]:
        if target == WITNESS:
            return {"node": WITNESS, "address": "", "host": "", "port": "",
                    "role": role, "primary": primary}  # fmt: skip
        host, port = split_address(target)
        return {"node": self.names[target], "address": target, "host": host, "port": port,
                "role": role, "primary": primary}  # fmt: skip

    async def _run(self, what: str, command: str) -> None:
        self._count += 1
        log = self.workdir / f"command-{self._count}.log"
        child = Child(what, [command], log, shell=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {command}\n")
        child.start()
        status = await asyncio.to_thread(child.wait, self.command_timeout)
        if status is None:
            await asyncio.to_thread(child.kill)  # the command hung: its whole group goes
            raise SetupError(f"{what} did not return within {self.command_timeout:g} s: {command}")
        child.forget()  # whatever it started in the background belongs to the deployment
        if status != 0:
            raise SetupError(f"{what} exited with status {status}: {command}\n{child.tail()}")

    async def kill(self, target: str) -> None:
        values = self._values(target, "", "")
        await self._run(f"kill command ({values['node']})", render(self.kill_cmd, values))

    async def restart(self, target: str, *, role: str, primary: str) -> None:
        values = self._values(target, "" if self.auto else role, primary)
        await self._run(f"start command ({values['node']})", render(self.start_cmd, values))

    async def start(self) -> None:
        """Nothing to start: the deployment runs already."""

    def check_alive(self) -> None:
        """Nothing to check locally (the nodes are the operator's)."""

    def log_tail(self, address: str, lines: int = 20) -> str:
        return ""

    async def close(self) -> None:
        """Nothing to stop: the drill leaves the deployment running."""
