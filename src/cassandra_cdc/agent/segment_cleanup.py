"""What happens to a segment once it is COMPLETED and fully acknowledged: ``cleanup.mode`` applied to its
files or, damaged, the whole segment moved into the quarantine."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from .agent_config import Cleanup
from .cdc_raw import CdcSegment, move_files
from .positions import private_directory
from .quarantine import Quarantine

log = logging.getLogger(__name__)


class SegmentCleanup:
    def __init__(self, cleanup: Cleanup, quarantine: Quarantine) -> None:
        self.cleanup = cleanup
        self.quarantine = quarantine

    def dispose(self, segment: CdcSegment, damaged: bool) -> bool:
        """Clean up a finished segment (or keep it whole when damaged); whether it is gone from cdc_raw."""
        # The idx first: a crash between the two leaves the segment, which the restarted agent finishes cleaning
        # up (its saved position says completed), rather than an idx nothing would ever remove.
        files = [p for p in (segment.index_path, segment.path) if p.exists()]
        if damaged:
            self.quarantine.keep_whole(segment, files)
            return True
        return self._clean_up(segment, files)

    def _clean_up(self, segment: CdcSegment, files: list[Path]) -> bool:
        """Apply ``cleanup.mode`` to a published segment's files; whether they are gone from cdc_raw."""
        cleanup = self.cleanup
        if cleanup.mode == "keep":
            return False
        if cleanup.mode == "archive":
            assert cleanup.archive_dir is not None
            move_files(files, private_directory(cleanup.archive_dir))
        elif cleanup.mode == "command":
            assert cleanup.command is not None
            command = cleanup.command.format(segment=segment.path, index=segment.index_path)
            result = subprocess.run(command, shell=True, capture_output=True, text=True)
            if result.returncode != 0:
                log.error("cleanup command for %s failed (exit %d): %s; retrying later", segment.path.name,
                          result.returncode, result.stderr.strip()[-500:])
                return False
            for path in files:
                path.unlink(missing_ok=True)
        else:
            for path in files:
                path.unlink(missing_ok=True)
        log.info("%s published completely (%s)", segment.path.name, cleanup.mode)
        return True
