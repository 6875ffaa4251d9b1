"""The stages of a collection (enricher.stages): one rule caches every stage, and adding one is
a class and an entry. The worked example of docs/architecture.md is this module's
``DeviceCountStage``; it runs here on the demo's SIMULATED node (no GPU here), through the
real Scraper."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from enricher import demo
from enricher.config import Config
from enricher.power import UpstreamPower
from enricher.stages import Chunk, Collection

from .frozendemo import T0


class DeviceCountStage:
    """docs/architecture.md's worked example: the number of GPUs NVML lists."""

    name = "device-count"

    def __init__(self) -> None:
        self.writes = 0

    def reads(self, c: Collection) -> tuple[object, ...]:
        return (len(c.node.snapshot.devices),)

    def write(self, c: Collection) -> Chunk:
        self.writes += 1
        n = len(c.node.snapshot.devices)
        text = f"# HELP gpu_devices GPUs NVML lists.\n# TYPE gpu_devices gauge\ngpu_devices {n}\n"
        return Chunk(text.encode())


class TextStage:
    """A stage that reads the upstream body only."""

    name = "text"

    def __init__(self) -> None:
        self.writes: list[str | None] = []

    def reads(self, c: Collection) -> tuple[object, ...]:
        return (c.text,)

    def write(self, c: Collection) -> Chunk:
        self.writes.append(c.text)
        return Chunk((c.text or "").encode())


async def test_a_stage_added_to_the_list_writes_its_chunk_once_per_change(tmp_path: Path) -> None:
    socket_path = tmp_path / "pod-resources" / "kubelet.sock"
    socket_path.parent.mkdir()
    scraper, runners, kubelet = await demo.start_demo(
        Config(listen_address="127.0.0.1:0"), tmp_path / "proc", socket_path, clock=lambda: T0
    )
    stage = DeviceCountStage()
    scraper.assembler.stages.append(stage)  # what one entry in make_stages does
    try:
        first = (await scraper.scrape()).body.decode()
        again = (await scraper.scrape()).body.decode()
        # The rule itself (white box): a stage runs again only when what it reads differs, by
        # equality, not by object: a new read of the node with the same GPUs is the same.
        node = await scraper.node.read()
        readings = UpstreamPower()
        for text in ("a", "a", "b"):
            scraper.assembler.run_stage(stage, Collection(text, node, {}, {}, {}, readings))
        assert stage.writes == 1
        text_stage = TextStage()
        for text in ("a", "a", "b", "b", "a"):
            collection = Collection(text, node, {}, {}, {}, readings)
            chunk = scraper.assembler.run_stage(text_stage, collection)
            assert chunk.body == text.encode()
        assert text_stage.writes == ["a", "b", "a"]
    finally:
        for runner in runners:
            await runner.cleanup()
        kubelet.stop()
        await scraper.close()
    families = {f.name: f for f in text_string_to_metric_families(first)}
    assert families["gpu_devices"].samples[0].value == len(demo.GPUS)
    # Its chunk follows the product's stages' (the idle ledger's family last among them), and
    # the self-metrics follow it.
    last_active = first.index("# HELP gpu_container_last_active_timestamp_seconds")
    assert last_active < first.index("# HELP gpu_devices") < first.index("# HELP dcgm_enricher_")
    # The same collection read again (the clock is stopped): the stage is not run again.
    assert "gpu_devices 8" in again


def test_the_product_stages_are_in_the_order_of_the_body() -> None:
    from enricher.families import RenderOptions
    from enricher.promclient import LabelSets
    from enricher.stages import make_stages

    names = [s.name for s in make_stages(RenderOptions(), 0.0, LabelSets())]
    assert names == ["container-families", "power", "idle"]
