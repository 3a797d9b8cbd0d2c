"""NVIDIA's Xid catalogue as data: every code, what it means, and what gpufleet does about it.

Source: NVIDIA's "Xid Catalog" (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and the
Xid-Catalog.xlsx it links; the edition listing codes 1-172, the R575-R590 era, as stored in 2026). Each
row keeps the catalogue's code, mnemonic and description (a few long ones shortened: 13's two mnemonics,
45, 166, 171, 172) and its "Resolution Bucket (Immediate Action)" verbatim in `nvidia`; gpufleet's
action follows from that bucket by `BUCKET_ACTIONS`, so a row can only disagree with NVIDIA where it
says why (`CHOICES`: the codes whose bucket is blank). Cross-checked code by
code against leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go (generated 2025-10-29
from the same workbook) and NVIDIA/NVSentinel's xiderrorsmapping.csv; NVIDIA's k8s-device-plugin
(internal/rm/health.go) skips only 13, 31, 43, 45 and 68, which this table also never remediates.

The rules NVIDIA gives on top of the table (Xid 154 by its label, 48 solo or with 63/64, 144-150 by
their fatal/non-fatal sub-code, repeated 13/31 on one GPU) need the line's text or the GPU's recent
history; they are applied by fleetspec/faults/classify.py (in the node agent, and in the reconciler for
the driver's lines another detector copies into a condition). NVSwitch SXids and a GPU
lost at probe time (no Xid) are faults of their own kinds here too.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class FaultAction(str, Enum):
    """What a fault needs, mildest first. Every action that `remediates` contains the node and heals its
    job on a spare; the repair loop then treats the node as the action says (reconciler/core/repair.py)."""

    NONE = "none"                # informational, or another Xid carries the action
    RESTART_APP = "restart-app"  # the application on that GPU restarts; the node stays in service
    DIAGNOSE = "diagnose"        # NVIDIA's RUN_DCGMEUD: possibly the hardware; diagnostics asked, the node serves on
    RESET_GPU = "reset-gpu"      # one GPU needs a reset
    REBOOT = "reboot"            # the machine needs a restart (RESTART_BM, RESTART_VM)
    CONTACT_SUPPORT = "contact-support"  # a person: cordoned, the job healed, the node held with a case page
    REPLACE = "replace"          # retire the machine (only where the spec says so: gpufleet's catalogue never does)

    @property
    def remediates(self) -> bool:
        """Takes the node out of service."""
        return self in (FaultAction.RESET_GPU, FaultAction.REBOOT, FaultAction.CONTACT_SUPPORT, FaultAction.REPLACE)

    @property
    def rank(self) -> int:
        return list(FaultAction).index(self)


class When(str, Enum):
    """When a fault's running job moves off its node.

    `job-boundary` is NVIDIA's DRAIN_AND_RESET (the Xid catalogue's resolution for WORKFLOW_XID_48 with 63/64 and
    for Xid 154's "Drain and Reset": docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Fault
    Resolution Buckets"): stop new work landing on the GPU, let the work on it finish, then reset it. gpufleet
    drains the node's Slurm nodes (DRAIN: the running job runs to its end, no new job starts) and heals the node
    once they run no job, or once `healing.job_boundary_max_seconds` passed (then at a checkpoint, as any fault)."""

    CHECKPOINT = "checkpoint"      # the running job checkpoints (SIGTERM, grace) and moves now
    JOB_BOUNDARY = "job-boundary"  # drained: the running job finishes, the node is healed when idle


class Kind(str, Enum):
    XID = "xid"            # NVRM: Xid (PCI:...): N, ...
    SXID = "sxid"          # nvidia-nvswitchN: SXid (PCI:...): N, Fatal|Non-fatal, ...
    GPU_LOST = "gpu-lost"  # NVRM: The NVIDIA GPU ... has fallen off the bus (at probe time, no Xid)
    DCGM = "dcgm"          # a DCGM field past its threshold (telemetry.py); the code is the field's id
    NODE_LOST = "node-lost"  # the machine stopped answering: its Node's Ready condition not True for too long
    SLURM_DRAIN = "slurm-drain"  # Slurm drained the node itself (reconciler/core/slurm_reasons.py); code: the row's


# NVIDIA's immediate-action buckets (the catalogue's "Fault Resolution Buckets" sheet) -> gpufleet's action.
# CONTACT_SUPPORT, the "Unused" codes (all CONTACT_SUPPORT: seen at all, something is wrong), CHECK_MECHANICALS
# (Xid 54, auxiliary power not connected: a person at the machine) and UPDATE_SWFW (Xid 78, vGPU start: the
# software or firmware to update) all ask for a person, not for a new machine: the node is cordoned and held,
# with a page carrying what the vendor (or the person) needs. NVSentinel does the same: a CONTACT_SUPPORT
# event is quarantined and drained and never remediated, the node left cordoned for a person
# (github.com/NVIDIA/NVSentinel tests/smoke_test.go TestFatalUnsupportedHealthEvent, "remediation skipped
# for CONTACT_SUPPORT"). Nothing of NVIDIA's says to discard the machine, and retiring it (a terminated
# instance) loses the evidence the vendor asks for.
BUCKET_ACTIONS: dict[str, FaultAction] = {
    "IGNORE": FaultAction.NONE,
    "RESTART_APP": FaultAction.RESTART_APP,
    "RESET_GPU": FaultAction.RESET_GPU,
    "RESTART_BM": FaultAction.REBOOT,
    "RESTART_VM": FaultAction.REBOOT,           # on a VM node, the VM is the machine
    "CHECK_MECHANICALS": FaultAction.CONTACT_SUPPORT,
    "CONTACT_SUPPORT": FaultAction.CONTACT_SUPPORT,  # the "Unused" codes too
    "UPDATE_SWFW": FaultAction.CONTACT_SUPPORT,
    "XID_154": FaultAction.NONE,                # "follow Xid 154 reported guidance": read from its label (rules)
    "WORKFLOW_XID_45": FaultAction.NONE,        # "Not Solo: IGNORE (follow other Xid)"; solo it is a job killed
    "WORKFLOW_XID_48": FaultAction.RESET_GPU,   # solo RESET_GPU, with 63/64 DRAIN_AND_RESET: a reset both ways
    "WORKFLOW_NVLINK_ERR": FaultAction.RESET_GPU,   # Xid 74: "A GPU reset or node reboot is needed"
    "WORKFLOW_NVLINK5_ERR": FaultAction.RESET_GPU,  # 144-150: fatal sub-codes reset, non-fatal ones do nothing (rules)
    "CHECK_UVM": FaultAction.NONE,              # "SYMPATHETIC_REPORT_SOLO": the C2C fault's other Xid carries it
}

# Codes the catalogue gives no immediate action for (162-172): gpufleet's choice, and why.
CHOICES: dict[int, tuple[FaultAction, str]] = {
    162: (FaultAction.NONE, "power smoothing re-engaged: information"),
    163: (FaultAction.NONE, "catalogue: 'No GPU reset required'"),
    164: (FaultAction.NONE, "catalogue: monitor power swings"),
    165: (FaultAction.NONE, "catalogue: power smoothing disabled; replace only if swings are unacceptable"),
    166: (FaultAction.NONE, "confidential-computing mode only"),
    167: (FaultAction.REBOOT, "a fatal PCIe timeout: the link, like Xid 79's, needs the machine restarted"),
    168: (FaultAction.NONE, "only with ECC disabled: a configuration, not a fault"),
    169: (FaultAction.RESET_GPU, "an internal micro-controller halt, as Xid 62 (RESET_GPU)"),
    170: (FaultAction.NONE, "confidential-computing mode only"),
    171: (FaultAction.NONE, "detail of an Xid 48, which carries the action"),
    172: (FaultAction.NONE, "detail of an Xid 48, which carries the action"),
}


@dataclass(frozen=True)
class Entry:
    code: int
    mnemonic: str
    description: str
    nvidia: str  # the catalogue's immediate-action bucket, verbatim ("" where it gives none)

    @property
    def action(self) -> FaultAction:
        if self.code in CHOICES:
            return CHOICES[self.code][0]
        return BUCKET_ACTIONS[self.nvidia]


_ROWS: tuple[tuple[int, str, str, str], ...] = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT"),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT"),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT"),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT"),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT"),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT"),
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP"),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT"),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT"),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP"),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP"),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "Unused", "IGNORE"),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT"),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT"),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT"),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT"),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP"),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    (27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT"),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT"),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT"),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT"),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP"),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP"),
    (33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT"),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT"),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT"),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT"),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE"),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE"),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP"),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP"),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP"),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT"),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE"),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE"),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU"),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48"),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT"),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT"),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT"),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT"),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT"),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS"),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT"),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT"),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT"),
    (58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT"),
    (59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT"),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP"),
    (61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT"),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt (newer drivers)", "RESET_GPU"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU"),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT"),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE"),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE"),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP"),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP"),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP"),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP"),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT"),
    (74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP"),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP"),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP"),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM"),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP"),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT"),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP"),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP"),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP"),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP"),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP"),
    (87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT"),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP"),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP"),
    (90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT"),
    (91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE"),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE"),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU"),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP"),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP"),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP"),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP"),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP"),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP"),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP"),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP"),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP"),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP"),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE"),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE"),
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE"),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU"),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU"),
    (111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT"),
    (112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT"),
    (113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT"),
    (114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT"),
    (115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT"),
    (116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT"),
    (117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT"),
    (118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT"),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU"),
    (120, "GSP_ERROR", "GSP Error", "RESET_GPU"),
    (121, "C2C_ERROR", "C2C Error", "IGNORE"),
    (122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT"),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT"),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT"),
    (125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT"),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP"),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP"),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP"),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP"),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP"),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP"),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP"),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP"),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP"),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP"),
    (136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU"),
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE"),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT"),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU"),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE"),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT"),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU"),
    (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR"),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR"),
    (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM"),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE"),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154"),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU"),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU"),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE"),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU"),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM"),
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE"),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE"),
    (162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", ""),
    (163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", ""),
    (164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", ""),
    (165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", ""),
    (166, "NVLINK_SECURE_CRYPTO_ERR", "CC traffic before the link is set up for encryption", ""),
    (167, "PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", ""),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", ""),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt", ""),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", ""),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Detail of an Xid 48: uncorrectable DRAM error", ""),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Detail of an Xid 48: uncorrectable SRAM error", ""),
)

XIDS: dict[int, Entry] = {r[0]: Entry(*r) for r in _ROWS}

# RESTART_APP codes the hardware raised and contained: the GPU stopped only the application that touched
# the bad memory, and the GPU stays usable (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt, "Error
# Containment": Xid 94 is a contained uncorrectable error, 95 an uncontained one). The other RESTART_APP
# codes point at the application first (an engine exception, a page fault: the job's own bug, most often).
CONTAINED_HARDWARE = frozenset({94})

# The buckets whose fault is the application's, not the GPU's: NVIDIA's immediate action restarts the
# application or ignores the line (RESTART_APP, IGNORE; Xid 45 is the cleanup after another Xid). Such a
# fault never takes a node out, and never counts toward a lemon (reconciler/core/repair.py), whatever a
# spec's override made of it: a crashing training script is not a failing machine.
APPLICATION_BUCKETS = frozenset({"RESTART_APP", "IGNORE", "WORKFLOW_XID_45"})


def application(kind: "Kind | str", code: int) -> bool:
    """An Xid NVIDIA's catalogue puts on the application (13, 31, 43, 45, 94, ...): the application restarts,
    the node stays in service (94 included: a hardware error, but one the GPU contained, CONTAINED_HARDWARE)."""
    e = XIDS.get(code) if Kind(kind) is Kind.XID else None
    return e is not None and e.nvidia in APPLICATION_BUCKETS

# NVSwitch SXids: the Fabric Manager user guide splits them into fatal and non-fatal, as the line
# itself says ("Fatal," or "Non-fatal," after the code). A fatal one takes the NVSwitch and the GPUs of
# its baseboard down together (NVSentinel's sxiderrorsmapping.csv: RESET_FABRIC for most); the node is
# restarted. Non-fatal ones are counted, not acted on.
SXID_FATAL = FaultAction.REBOOT
SXID_NONFATAL = FaultAction.NONE
# A GPU gone at probe time (osapi.c's "has fallen off the bus and is not responding to commands"):
# like Xid 79 (RESTART_BM), and nothing else will report it.
GPU_LOST = FaultAction.REBOOT
# A machine that stopped answering (its kubelet no longer posts Ready): nothing on it can say what broke, so it
# is rebooted through its provider, the first step of the repair loop's ladder (Cluster API's MachineHealthCheck
# remediates a Machine whose Ready condition stays Unknown or False past a timeout the same way: by replacing it).
NODE_LOST = FaultAction.REBOOT
# A node Slurm drained itself: each reason's row says what it asks (reconciler/core/slurm_reasons.py) and the
# condition carries it; one without the header is checked, the milder of the two.
SLURM_DRAIN = FaultAction.DIAGNOSE


def default_action(kind: Kind, code: int, fatal: bool | None = None) -> FaultAction:
    """The catalogue's action for a code, before NVIDIA's rules and the spec's overrides. An Xid the
    catalogue does not list (a newer driver's) takes no node out until the spec names its action: the
    agent logs it as unknown (the EKS node monitoring agent, too, only reports XIDs it does not know)."""
    if kind is Kind.XID:
        e = XIDS.get(code)
        return e.action if e else FaultAction.NONE
    if kind is Kind.SXID:
        return SXID_FATAL if fatal else SXID_NONFATAL
    if kind is Kind.DCGM:
        from .telemetry import threshold_for  # the table imports FaultAction from here
        t = threshold_for(code)
        return t.action if t else FaultAction.NONE
    if kind is Kind.NODE_LOST:
        return NODE_LOST
    if kind is Kind.SLURM_DRAIN:
        return SLURM_DRAIN
    return GPU_LOST


def describe(code: int, kind: Kind | str = Kind.XID) -> str:
    """`XID 79 (GPU has fallen off the bus)`, `SXid 24007`, `GPU lost at probe`."""
    kind = Kind(kind)
    if kind is Kind.SXID:
        return f"SXid {code}"
    if kind is Kind.GPU_LOST:
        return "GPU lost at probe"
    if kind is Kind.NODE_LOST:
        return "the machine stopped answering"
    if kind is Kind.SLURM_DRAIN:
        return "Slurm's own drain"
    if kind is Kind.DCGM:
        from .telemetry import describe_field
        return describe_field(code)
    if code == 0:
        return "GPU fault"  # a detector's condition that names no code
    e = XIDS.get(code)
    return f"XID {code} ({e.description})" if e and e.description != "Unused" else f"XID {code}"
