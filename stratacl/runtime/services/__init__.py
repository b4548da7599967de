"""The rank's services: what every part of a rank (and the launcher) stands on.

    _control    the job's control segment: its layout (header, a region per rank, the
                communicators' slots) and ``Control``, every process's view of it
    _sync       waits with deadlines: a yielding spin, then futex sleeps; a dead peer or the
                job's failure ends a wait with an error naming them (``wait_until``, ``JobHealth``)
    _mailbox    host-DRAM mailbox rings between ranks and the daemon (registration metadata)
    _flight     the flight recorder read back: every rank's last calls (the launcher's report)
    _pads       signal pads' words and the one way a word of HBM is updated (one-sided calls)
    _trace      a rank's calls in modeled time, recorded for ``stratacl.ub.replay``

Their words live in shared memory and are read and written through the runtime's native
layer (stratacl/runtime/_native.h; the flight recorder and the waits are written in C there).
"""
from . import _flight as flight
from ._control import CARRIER_QUEUE as CARRIER_QUEUE
from ._control import COMM_SLOTS as COMM_SLOTS
from ._control import Control as Control
from ._control import DESC_FIXED as DESC_FIXED
from ._control import EXT_WORDS_EXTRA as EXT_WORDS_EXTRA
from ._control import FAILED_CARRIER as FAILED_CARRIER
from ._control import FAILED_DAEMON as FAILED_DAEMON
from ._control import FAILED_EXIT as FAILED_EXIT
from ._control import FAILED_GONE as FAILED_GONE
from ._control import FAILED_SIGNAL as FAILED_SIGNAL
from ._control import FLAG_REJECTED as FLAG_REJECTED
from ._control import F_ADDR as F_ADDR
from ._control import F_AUX0 as F_AUX0
from ._control import F_AUX1 as F_AUX1
from ._control import F_AUX2 as F_AUX2
from ._control import F_CALL as F_CALL
from ._control import F_COUNT as F_COUNT
from ._control import F_DTYPE as F_DTYPE
from ._control import F_EPOCH as F_EPOCH
from ._control import F_FLAGS as F_FLAGS
from ._control import F_NBYTES as F_NBYTES
from ._control import F_OP as F_OP
from ._control import F_REDOP as F_REDOP
from ._control import F_ROOT as F_ROOT
from ._control import F_SEG_OFF as F_SEG_OFF
from ._control import F_SEG_SIZE as F_SEG_SIZE
from ._control import F_SEG_VA as F_SEG_VA
from ._control import H_CARRIER as H_CARRIER
from ._control import H_CARRIER_BELL as H_CARRIER_BELL
from ._control import H_CARRIER_PID as H_CARRIER_PID
from ._control import H_CARRIER_READ as H_CARRIER_READ
from ._control import H_HBM_SIZE as H_HBM_SIZE
from ._control import H_MAGIC as H_MAGIC
from ._control import H_SLICE as H_SLICE
from ._control import H_VA_BASE as H_VA_BASE
from ._control import Layout as Layout
from ._control import MAGIC as MAGIC
from ._control import P2P_DESC as P2P_DESC
from ._control import REASON_BYTES as REASON_BYTES
from ._control import STATE_DEAD as STATE_DEAD
from ._control import STATE_FINALIZED as STATE_FINALIZED
from ._control import STATE_RUNNING as STATE_RUNNING
from ._control import WORLD_INIT_CALLS as WORLD_INIT_CALLS
from ._control import carrier_failure as carrier_failure
from ._control import host_lost as host_lost
from ._mailbox import BROADCAST as BROADCAST
from ._mailbox import Mailbox as Mailbox
from ._mailbox import unpack_header as unpack_header
from ._control import OS_A as OS_A
from ._control import OS_ARRIVAL as OS_ARRIVAL
from ._control import OS_B as OS_B
from ._control import OS_DONE as OS_DONE
from ._control import OS_GET as OS_GET
from ._control import OS_KIND as OS_KIND
from ._control import OS_NBYTES as OS_NBYTES
from ._control import OS_OFFSET as OS_OFFSET
from ._control import OS_OLD as OS_OLD
from ._control import OS_PEER as OS_PEER
from ._control import OS_PUT as OS_PUT
from ._control import OS_SEQ as OS_SEQ
from ._control import OS_STRIDE as OS_STRIDE
from ._control import OS_UPDATE as OS_UPDATE
from ._control import R_ONESIDED as R_ONESIDED
from ._pads import LOG_ENTRIES as LOG_ENTRIES
from ._pads import MASK64 as MASK64
from ._pads import PAD_LAST as PAD_LAST
from ._pads import PAD_LOG as PAD_LOG
from ._pads import PAD_ROWS as PAD_ROWS
from ._pads import PAD_SEQ as PAD_SEQ
from ._pads import PAD_SIGNAL as PAD_SIGNAL
from ._pads import PAD_WAITERS as PAD_WAITERS
from ._pads import UPDATES as UPDATES
from ._pads import update_word as update_word
from ._sync import JobHealth as JobHealth
from ._sync import SLICE as SLICE
from ._sync import SPIN_POLLS as SPIN_POLLS
from ._sync import WAKE_ALL as WAKE_ALL
from ._sync import wait_until as wait_until
from ._trace import Trace as Trace

__all__ = [
    "BROADCAST", "CARRIER_QUEUE", "COMM_SLOTS", "DESC_FIXED", "EXT_WORDS_EXTRA", "FAILED_CARRIER", "FAILED_DAEMON",
    "FAILED_EXIT", "FAILED_GONE", "FAILED_SIGNAL", "FLAG_REJECTED", "F_ADDR", "F_AUX0", "F_AUX1", "F_AUX2",
    "F_CALL", "F_COUNT", "F_DTYPE", "F_EPOCH", "F_FLAGS", "F_NBYTES", "F_OP", "F_REDOP", "F_ROOT", "F_SEG_OFF",
    "F_SEG_SIZE", "F_SEG_VA", "H_CARRIER", "H_CARRIER_BELL", "H_CARRIER_PID", "H_CARRIER_READ", "H_HBM_SIZE",
    "H_MAGIC", "H_SLICE", "H_VA_BASE", "LOG_ENTRIES", "MAGIC", "MASK64", "OS_A", "OS_ARRIVAL", "OS_B", "OS_DONE",
    "OS_GET", "OS_KIND", "OS_NBYTES", "OS_OFFSET", "OS_OLD", "OS_PEER", "OS_PUT", "OS_SEQ", "OS_STRIDE",
    "OS_UPDATE", "P2P_DESC", "PAD_LAST", "PAD_LOG", "PAD_ROWS", "PAD_SEQ", "PAD_SIGNAL", "PAD_WAITERS",
    "REASON_BYTES", "R_ONESIDED", "SLICE", "SPIN_POLLS", "STATE_DEAD", "STATE_FINALIZED", "STATE_RUNNING",
    "UPDATES", "WAKE_ALL", "WORLD_INIT_CALLS", "Control", "JobHealth", "Layout", "Mailbox", "Trace",
    "carrier_failure", "flight", "host_lost", "unpack_header", "update_word", "wait_until",
]
