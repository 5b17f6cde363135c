"""The Hopper kernels ``sm90_tma`` (conv2d) and ``conv3d_native`` (conv3d): plans and launches.

Both run kernels_cu/sm90/conv_fprop_sm90.cu (its opening comment lists the warp roles and
barriers): TMA im2col boxes or halo windows feed a warp-specialized wgmma mainloop; an
epilogue-load warp prefetches the residual. Data flow of one call::

    x (N, [D,] H, W, C)  --TMA im2col box per (tile, [t,] r, s, c-block), or halo window-->  smem ring
      (or x (N, C, [D,] H, W) as it is: a window per (tile, [t,] c-block, s) of 64-pixel channel rows)
    w (K, [T,] R, S, C)  --TMA tile box (BN filters, one tap, 64 channels)-->  smem ring  --wgmma--> fp32
    residual (M, K)      --epilogue-load warp, TMA 64-channel chunks-->  C ring (beta != 0 only)
    fp32 --act(alpha*acc + bias + beta*C), cast--> out (M, K)

:class:`Sm90Plan` holds the tile configuration (:mod:`.tiles`, decided once per plan) and, per set
of input addresses and stream, a launch record: the TMA descriptors (:mod:`.tensormap`), the
parameter struct (:mod:`.params`) and the packed arguments (:class:`cuconv.launch.PackedLaunch`), so
a repeated call rewrites the output pointer and launches.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ... import launch as _launch
from ...launch import LaunchRecords, PackedLaunch, epilogue_params, header_constants
from ...plan import Declined, Kernel, Plan
from ...registry import register
from ...scratch import scratch
from .params import BlockDiag, MnFilter, kernel_params, phase_table, tap_table, zero_block
from .tensormap import (cuda_driver, encode_cf_x, encode_halo_c, encode_halo_x, encode_im2col_x, encode_mn_w,
                        encode_tiled_c, encode_tiled_w, placeholder_descriptor, tma_box_params, tma_limits_violation)
from .tiles import (BLOCK_K, HALO_A_STAGES, NARROW_BLOCK_N, NARROW_MAX_K, XPOSE_MAX_N_TILES, XPOSE_ST_STAGES, TileConfig,
                    channels_first_x_decline, channels_first_x_pays, halo_why_not, halo_window, narrow_tiles,
                    staging_row, tile_config, transposed_x_decline)
from .variants import SOURCE, defines, kernel_name, load_function, ring_loads_residual

__all__ = ["Sm90TmaKernel", "Sm90TmaConv3d", "Sm90Plan"]

#: Launch records kept per plan (distinct input addresses x streams).
_RECORDS_PER_PLAN = 16
#: Filters per tile of the variants that write a block-diagonal filter (``SM90_BLOCKDIAG``): sm90_grouped
#: runs them; a plan that asks a wider tile to write one is refused.
BLOCKDIAG_TILE_N = header_constants("sm90/blockdiag_prologue.cuh")["SM90_BD_TILE_N"]
#: The view of :func:`.params.zero_block` as the MN-major variant's zero box.
_ZERO_VIEW = MnFilter(64, 1, 64, (0,))


class Sm90TmaKernel(Kernel):
    """conv2d on Hopper: TMA im2col (4-D boxes) or halo tiles + warp-specialized wgmma."""

    name = "sm90_tma"
    backend = "cuda"
    priority = 100
    spatial_dims = (2,)

    def plan(self, problem, device, overrides):
        """The plan of :meth:`make_plan`; for an NCHW / NCDHW problem, the plan reading x channels-first
        itself where :func:`channels_first_x_plan` finds one (the kernels that rewrite a problem for this one
        call :meth:`make_plan`: their x is channels-last)."""
        plan = super().plan(problem, device, overrides)
        return channels_first_x_plan(plan, overrides) if isinstance(plan, Sm90Plan) else plan

    def make_plan(self, problem, device, overrides, out_f32: bool = False, x_channels: int = 0, tf32: bool = False,
                  xsplit: bool = False):
        """The plan, or why not. ``out_f32``: the variant whose epilogue stores float32 (with float32
        bias and residual), for 16-bit operands that are parts of float32 data
        (:mod:`.split_precision`). ``x_channels``: x holds fewer channels than the reduction walks (a
        multiple of 64; the blocks past them read x's first blocks again), 0 for ``problem.channels``.
        ``tf32`` (with ``out_f32``): ``problem`` is the 16-bit view of float32 operands (twice the
        channels, :mod:`.tf32`), multiplied as tf32. ``xsplit``: ``problem`` is that view too, x split
        into bf16 parts in the consumers' registers against a filter split per 16 channels
        (:mod:`.split_precision`), float32 output."""
        if not device.is_hopper:
            return not_hopper(device)
        if problem.dtype not in ("float16", "bfloat16"):
            return Declined(f"dtype {problem.dtype}: wgmma path serves float16 and bfloat16 only")
        declined = hopper_dense_decline(problem, device)
        if declined is not None:
            return declined
        if problem.channels % 8:
            return Declined(f"C={problem.channels} is not a multiple of 8 (TMA needs 16-byte pixel strides)")
        narrow = not (out_f32 or tf32 or xsplit) and narrow_tiles(problem, overrides)
        if problem.out_channels % 8 and not (out_f32 or narrow):  # the float32 and narrow epilogues store any K
            why = (f"block_n={overrides.block_n} is forced" if overrides.block_n is not None
                   else f"the narrow variant takes K <= {NARROW_MAX_K} (block_n={NARROW_BLOCK_N} forces it)")
            return Declined(f"K={problem.out_channels} is not a multiple of 8 (16-byte output rows), and {why}")
        why = tma_limits_violation(problem)
        if why:
            return Declined(why)
        if tf32 or xsplit or narrow:  # their consumers read the residual (no C ring)
            cfg = tile_config(_without_residual_ring(problem), device.sm_count, overrides, out_f32=xsplit, tf32=tf32,
                              narrow=narrow)
        else:
            cfg = tile_config(problem, device.sm_count, overrides, out_f32)
        too_much = smem_over(cfg, ring_loads_residual(problem.epilogue.loads_residual, tf32, xsplit, narrow), device)
        if too_much:
            return Declined(too_much)
        return Sm90Plan(self, problem, device, cfg, overrides,
                        f"Hopper TMA im2col ({problem.nd + 2}-D boxes) + wgmma kernel covers this problem",
                        out_f32=out_f32 or tf32 or xsplit, x_channels=x_channels, tf32=tf32, xsplit=xsplit)


def smem_over(cfg: TileConfig, loads_residual_ring: bool, device):
    """Why ``cfg``'s launch does not fit the device's shared memory per block, or None."""
    need = cfg.smem_bytes(loads_residual_ring)
    if device.smem_per_block_optin and need > device.smem_per_block_optin:
        return f"needs {need} bytes of shared memory per block, the device allows {device.smem_per_block_optin}"
    return None


def channels_first_x_plan(plan: "Sm90Plan", overrides) -> "Sm90Plan":
    """``plan`` (of a channels-first problem, storing channels-first) as halo tiles reading x channels-first
    where :func:`.tiles.channels_first_x_pays` or ``overrides.x_channels_first`` True says so: staged rows
    transposed in shared memory (``_xp``) where :func:`.tiles.transposed_x_decline` allows them and the tiles
    have at most :data:`.tiles.XPOSE_MAX_N_TILES` column tiles (each transposes every window again:
    docs/tuning.md T-xpose-x), else windows of 64-pixel channel rows (``_cf``) where
    :func:`.tiles.channels_first_x_decline` allows them. ``overrides.x_transpose`` True takes the transposed
    rows wherever they apply, False never. Otherwise ``plan`` itself, which then records why x is moved
    (``explain``). ``overrides.x_channels_first`` False keeps ``plan``."""
    if not plan.writes_channels_first:
        return plan
    if plan.narrow:
        plan.x_moved_because = f"the narrow variant's {NARROW_BLOCK_N}-column tiles read x channels-last"
        return plan
    forced, xpose, p = overrides.x_channels_first, overrides.x_transpose, plan.problem
    if forced is False:
        plan.x_moved_because = "switched off (overrides(x_channels_first=False) / CUCONV_SM90_CF_X=0)"
        return plan
    ways = {"a_xpose": ("switched off (overrides(x_transpose=False) / CUCONV_SM90_XPOSE_X=0)" if xpose is False
                        else transposed_x_decline(p)),
            "a_cf": channels_first_x_decline(p)}
    why = None if forced or all(ways.values()) else channels_first_x_pays(p)
    if why is None:
        for way in ways:
            if ways[way] is None:
                cfg = tile_config(p, plan.device.sm_count, overrides, **{way: True})
                ways[way] = smem_over(cfg, False, plan.device)
                if way == "a_xpose" and ways[way] is None and xpose is None and cfg.n_tiles > XPOSE_MAX_N_TILES:
                    ways[way] = (f"{cfg.n_tiles} column tiles of {cfg.block_n} would transpose every window "
                                 f"{cfg.n_tiles} times (more than {XPOSE_MAX_N_TILES})")
                if ways[way] is None:
                    return Sm90Plan(plan.kernel, p, plan.device, cfg, overrides, plan.reason)
        why = f"transposed rows: {ways['a_xpose']}; windows of channel rows: {ways['a_cf']}"
    plan.x_moved_because = why
    return plan


def nchw_store_pattern(problem, halo: bool) -> str:
    """How the channels-first epilogue stores (``explain``): 8-byte stores of 4 pixels of a channel where
    every warp's rows can (``consumer_epilogue_nchw`` decides per warp, from the same facts), else 16-bit
    stores."""
    plane = int(np.prod(problem.out_spatial))
    if plane % 4:
        return f"16-bit stores along each channel plane: its {plane} pixels are not a multiple of 4"
    q = problem.out_spatial[-1]
    if halo and q % 4:
        return (f"8-byte stores of 4 pixels per channel where a warp's output rows start on a multiple of 4, "
                f"16-bit stores elsewhere: rows of {q} pixels")
    return "8-byte stores of 4 pixels per channel; 16-bit stores only for an out or residual view not 8-byte aligned"


def _without_residual_ring(problem):
    """``problem`` as the tile policy sees a variant whose consumers read the residual themselves (no C
    ring in shared memory, no epilogue-load warp)."""
    return dataclasses.replace(problem, epilogue=dataclasses.replace(problem.epilogue, has_residual=False))


def hopper_dense_decline(problem, device):
    """The decline every kernel of this backend gives first (another GPU, or groups), or None."""
    if not device.is_hopper:
        return not_hopper(device)
    if problem.groups != 1:
        return Declined(f"groups={problem.groups}: grouped/depthwise convolution is not covered (groups == 1 only)")
    return None


class RewritingKernel(Kernel):
    """A kernel that rewrites a problem for the Hopper kernel ``inner`` (float32 as split parts, a width
    fold): the backend's common declines first, then :meth:`rewrite_plan`."""

    def __init__(self, inner: Kernel):
        self.inner = inner

    def make_plan(self, problem, device, overrides):
        declined = hopper_dense_decline(problem, device)
        return declined if declined is not None else self.rewrite_plan(problem, device, overrides)

    def rewrite_plan(self, problem, device, overrides):  # pragma: no cover - every subclass defines it
        raise NotImplementedError


class RewritingPlan(Plan):
    """The plan of a rewritten problem: ``inner``, the Hopper plan of what the problem was rewritten to,
    which :meth:`run` of a subclass calls on the rewritten operands. Its compile jobs are the inner plan's
    and the subclass's own passes (:attr:`extra_jobs`)."""

    #: ``(source, defines)`` of the passes the rewrite launches besides the inner plan.
    extra_jobs: tuple = ()

    def __init__(self, kernel, problem, device, inner, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.inner = inner

    def compile_jobs(self):
        return self.inner.compile_jobs() + self.extra_jobs




def not_hopper(device) -> Declined:
    """The decline of every kernel of this backend on another GPU."""
    return Declined(f"needs a Hopper GPU (compute capability 9.0, sm_90a: TMA im2col + wgmma); "
                    f"this one is cc {device.cc[0]}.{device.cc[1]} ({device.name})")


class Sm90TmaConv3d(Sm90TmaKernel):
    """conv3d's "native" strategy: the same kernel over NDHWC (5-D im2col boxes, or halo windows).

    One launch, no temporaries: the reduction walks (t, r, s, channel block), so temporal padding,
    stride and dilation cost nothing extra. Preferred over the Q-slice strategy by ``auto``.
    """

    name = "conv3d_native"
    priority = 95
    spatial_dims = (3,)
    strategy = "native"


class Sm90Plan(Plan):
    """A Hopper plan: the tile configuration, the compiled variant, and launch records per address set."""

    def __init__(self, kernel, problem, device, cfg: TileConfig, overrides, reason: str, out_f32: bool = False,
                 x_channels: int = 0, tf32: bool = False, xsplit: bool = False):
        super().__init__(kernel, problem, device, reason)
        self.cfg = cfg
        if x_channels and (x_channels % BLOCK_K or not 0 < x_channels <= problem.channels):
            raise ValueError(f"x_channels: expected a multiple of {BLOCK_K} up to C={problem.channels}, "
                             f"got {x_channels}")
        #: Channels x holds (``problem.channels`` unless a plan on split parts says fewer).
        self.x_channels = x_channels or problem.channels
        #: The problem as x's descriptor sees it (its channel count).
        self._x_problem = (problem if self.x_channels == problem.channels
                           else dataclasses.replace(problem, channels=self.x_channels))
        #: The epilogue stores float32 (``out``, ``bias`` and ``residual`` are float32, channels-last).
        self.out_f32 = out_f32
        #: The operands are float32 data seen as 16-bit pairs, multiplied as tf32 (:mod:`.tf32`).
        self.tf32 = tf32
        #: x is float32 data seen as 16-bit pairs, split into bf16 parts in registers (:mod:`.split_precision`).
        self.xsplit = xsplit
        #: 16-bit output of any K from 16-column tiles, stored value by value (the ``_nk`` variants; the
        #: consumers read the residual).
        self.narrow = cfg.block_n == NARROW_BLOCK_N and not out_f32
        #: A channels-first problem's output (and residual) are stored by the epilogue in that layout.
        self.writes_channels_first = problem.layout in ("NCHW", "NCDHW") and not out_f32
        #: ... and its x read in that layout too (``cfg.a_cf`` / ``cfg.a_xpose``: the ``_cf`` / ``_xp`` variants;
        #: the filter is moved).
        self.reads_x_channels_first = cfg.reads_x_channels_first
        #: Why a channels-first problem's x is moved to channels-last (:func:`channels_first_x_plan`), or None.
        self.x_moved_because = None
        #: Where the epilogue stores the stacked phases of an input gradient (:mod:`.phase_scatter`), or None.
        self.phase_scatter = None
        #: How the filter operand is read MN-major from ``run``'s ``w``, an input gradient's forward weight
        #: (:class:`.params.MnFilter`; :mod:`.phase_scatter`, ``direct_filter``), or None (``w`` is the
        #: convolution's own filter, read K-major).
        self.mn_filter = None
        #: ``(a_kg, a_cg)`` of a grouped convolution run as dense tiles (:mod:`.grouped`): output channel n
        #: reads x from channel ``(n // a_kg) * a_cg`` on; ``(0, 0)`` for a dense one.
        self.groups = (0, 0)
        #: Narrow groups: ``(taps, Cg)`` of the weight ``run`` gets, whose block-diagonal filter the kernel's
        #: grid writes into a scratch buffer before it reads it (:mod:`.grouped`); None otherwise.
        self.blockdiag = None
        self._overrides = overrides
        self.reset_launches()

    def read_groups(self, x_channels: int, a_kg: int, a_cg: int, blockdiag=None) -> None:
        """Make this plan of one tile's dense problem run a grouped convolution (:mod:`.grouped`): x holds
        ``x_channels`` channels, and output channel n's reduction reads them from ``(n // a_kg) * a_cg`` on.
        ``blockdiag``: ``(taps, Cg)`` where ``run``'s ``w`` is the grouped weight and the kernel writes its
        block-diagonal filter first."""
        if self.cfg.reads_x_channels_first:
            raise ValueError("read_groups: this plan reads x channels-first (dense tiles only)")
        self._x_problem = dataclasses.replace(self.problem, channels=x_channels)
        self.groups = (a_kg, a_cg)
        self.blockdiag = blockdiag
        self.reset_launches()

    @property
    def b_mn(self) -> bool:
        """Whether the filter is read MN-major from a forward weight (the ``_bmn`` variant)."""
        return self.mn_filter is not None

    def reset_launches(self) -> None:
        """Forget the loaded variant, the launch records and the description (a copy of the plan with
        another variant starts from here)."""
        self._records = LaunchRecords(_RECORDS_PER_PLAN)
        self._function = None   # (fn, smem, grid CTAs), loaded on the first run
        self._description = None

    @property
    def launch_records(self) -> int:
        """How many launch records (distinct input addresses x streams) the plan holds."""
        return len(self._records)

    def describe(self) -> str:
        if self._description is None:
            self._description = self._describe()
        return self._description

    def _describe(self) -> str:
        cfg, problem = self.cfg, self.problem
        res = problem.epilogue.loads_residual
        unit = "tile" if cfg.cluster == 1 else "pair of tiles (CTA pairs multicast the filter tile)"
        grid = (f"persistent grid {cfg.grid} CTAs over {cfg.num_units} units of one {unit}" if cfg.persistent
                else f"grid {cfg.grid} CTAs, one {unit} per {'CTA' if cfg.cluster == 1 else 'pair'}")
        split = ""
        if cfg.split_tiles:
            which = "last wave's" if cfg.dp_tiles else "all"
            ways = "in two" if cfg.split_ways == 2 else f"{cfg.split_ways} ways"
            split = (f", {which} {cfg.split_tiles} tiles split {ways} along the reduction "
                     f"({' + '.join(map(str, cfg.split_steps))} steps; the last part adds the others' fp32 sums "
                     f"in part order)")
        if cfg.a_cf:
            R = problem.filter_spatial[-2]
            readers = f"the column's {R} taps" if R > 1 else "its one tap"
            loads = (f"halo tiles reading x channels-first ({cfg.tile_rows} output rows x 64 columns; one window of "
                     f"64-pixel channel rows per depth tap, channel block and filter column, read MN-major by "
                     f"{readers}; {HALO_A_STAGES} window slots; {cfg.stages}-slot filter ring)")
        elif cfg.a_xpose:
            st_w, _ = staging_row(problem)
            loads = (f"halo tiles reading x channels-first ({cfg.tile_rows} output rows x 64 columns; per depth tap "
                     f"and channel block each input row of the window staged by TMA ({st_w} pixels x 64 channels, "
                     f"a {XPOSE_ST_STAGES}-slot ring) and transposed into the channels-last window by the "
                     f"producer's two idle warps (ldmatrix.trans / stmatrix), shared by every (r, s) tap; "
                     f"{HALO_A_STAGES} window slots; {cfg.stages}-slot filter ring)")
        elif cfg.halo:
            loads = (f"halo tiles ({cfg.tile_rows} output rows x 64 columns; one input window per depth tap and "
                     f"channel block, {HALO_A_STAGES} window slots, shared by every (r, s) tap; "
                     f"{cfg.stages}-slot filter ring)")
        else:
            loads = (f"TMA im2col boxes per tap ({cfg.stages}-stage ring; not halo tiles: "
                     f"{halo_why_not(problem, self._overrides, self.narrow, cfg.block_n)})")
        if cfg.note:
            loads += f" ({cfg.note})"
        consumers = ("2 consumer warpgroups taking turns on whole tiles (ping-pong: one's epilogue runs beside "
                     "the other's mainloop)" if cfg.pingpong else f"{cfg.consumers} consumer warpgroups")
        nchw, f32 = self.writes_channels_first, self.out_f32
        if self.tf32:
            loads += "; float32 operands moved as 16-bit pairs, one tf32 wgmma (k8) per 32 bytes of the reduction"
        if self.xsplit:
            loads += ("; float32 x moved as 16-bit pairs and split into bf16 hi / lo in the consumers' registers, "
                      "three register-A bf16 wgmmas (k16) per 16 floats of the reduction")
        if f32:
            stores = "epilogue stores float32 (8-byte stores)" + (", reads the float32 residual there" if res else "")
        elif self.narrow:
            stores = (f"narrow epilogue stores {'channels-first ' if nchw else ''}16-bit values one by one "
                      f"({'pairs of columns as 4-byte stores where K is even and out aligned' if not nchw else 'any K'})"
                      + (", reads the residual there" if res else ""))
            if nchw and self.x_moved_because:
                stores += f"; x moved to channels-last first ({self.x_moved_because})"
        elif nchw:
            stores = f"epilogue stores channels-first ({nchw_store_pattern(problem, cfg.halo)})" + (
                ", reads the residual there" if res else "")
            if self.x_moved_because:
                stores += f"; x moved to channels-last first (not read channels-first: {self.x_moved_because})"
        elif self.phase_scatter is not None:
            stores = "epilogue stores each 32-column group at its phase's positions in the input gradient"
        else:
            stores = "epilogue-load warp prefetches the residual" if res else "no residual load"
        if self.b_mn:
            loads += ("; the filter read MN-major (64 x 64 boxes, a tap per phase and window tap) straight from the "
                      "forward weight, no transpose pass")
        return (f"{kernel_name(cfg, res, problem.nd, *self._flags)}: tile {cfg.block_m}x{cfg.block_n}x{cfg.block_k}, {loads}, "
                f"{consumers}, {grid}{split}, {stores}")

    def compile_jobs(self):
        p = self.problem
        return ((SOURCE, defines(self.cfg, p.dtype, p.epilogue.loads_residual, p.nd, *self._flags)),)

    @property
    def _flags(self) -> tuple:
        """The variant's flags, in the order of :func:`.variants.kernel_name` / ``defines`` / ``load_function``:
        channels-first output, float32 output, tf32, split x, phases stored into place, MN-major filter,
        narrow output."""
        return (self.writes_channels_first, self.out_f32, self.tf32, self.xsplit, self.phase_scatter is not None,
                self.b_mn, self.narrow)

    def run(self, x, w, bias, residual, out):
        """Launch; the record (descriptors, params, function, grid) is reused for the same input addresses.

        A TMA descriptor depends only on the geometry and the base address, so a record keyed by the
        x/w/bias/residual addresses and the stream (a split-tail launch owns a workspace per stream)
        serves any arrays at those addresses. The output is a plain pointer argument, rewritten per
        call. Records hold raw addresses only (nothing is kept alive).
        """
        stream = _launch.current_stream().ptr
        key = (x.data.ptr, w.data.ptr, 0 if bias is None else bias.data.ptr,
               0 if residual is None else residual.data.ptr, stream)
        launch = self._records.get(key)
        keep = None
        if launch is None:
            launch, cacheable, keep = self._build_launch(x, w, bias, residual)
            if cacheable:
                self._records.put(key, launch)
        if self.writes_channels_first or self.narrow or out.data.ptr % 16 == 0:  # 16-byte vector stores elsewhere
            launch.on_stream(stream, out.data.ptr)
        else:
            import cupy as cp
            target = cp.empty_like(out)
            launch.on_stream(stream, target.data.ptr)
            out[...] = target
        del keep  # aligned input copies (if any) live until the launch above has been queued

    def _loaded(self):
        if self._function is None:
            cfg, p = self.cfg, self.problem
            fn, smem = load_function(self.device.index, cfg, p.dtype, p.epilogue.loads_residual, p.nd, *self._flags)
            grid = min(cfg.grid, cfg.cluster * _max_active_clusters(fn, cfg, smem, self.device))
            self._function = (fn, smem, grid)
        return self._function

    def _build_launch(self, x, w, bias, residual):
        problem, cfg = self.problem, self.cfg
        res = problem.epilogue.loads_residual
        fn, smem, grid_ctas = self._loaded()
        # TMA needs 16-byte aligned bases; a misaligned view (rare) goes through an aligned copy,
        # and such a record is not cached (the copy's address is new every call).
        xa, wa = _aligned(x), _aligned(w)
        ra = residual
        direct = self.writes_channels_first or self.out_f32 or self.narrow  # the residual is read by the consumers
        if res and direct:  # at its own address (float32: 8-byte loads)
            ra = _aligned(residual, 8) if self.out_f32 and problem.out_channels % 2 == 0 else residual
            tmap_c = placeholder_descriptor()
        elif res:
            ra = _aligned(residual)
            tmap_c = (encode_halo_c(problem, ra.data.ptr, cfg.tile_rows) if cfg.halo
                      else encode_tiled_c(problem, ra.data.ptr, cfg.block_m))
        elif self.b_mn:  # the box of zeros of a phase's missing tap
            tmap_c = encode_mn_w(problem, zero_block(self.device.index).data.ptr, _ZERO_VIEW, BLOCK_K)
        else:
            tmap_c = placeholder_descriptor()
        ba = _aligned(bias, 4) if bias is not None else None
        cacheable = xa is x and wa is w and ra is residual and ba is bias
        xp_ = self._x_problem
        if cfg.a_cf:
            tmap_x = encode_cf_x(xp_, xa.data.ptr)
        elif cfg.a_xpose:
            tmap_x = encode_cf_x(xp_, xa.data.ptr, columns=staging_row(problem)[0], swizzle=False)
        elif cfg.halo:
            tmap_x = encode_halo_x(xp_, xa.data.ptr, *halo_window(problem, cfg))
        else:
            tmap_x = encode_im2col_x(xp_, xa.data.ptr, tma_box_params(xp_, pixels_per_column=cfg.block_m))
        bd, bd_buffers = None, ()
        if self.blockdiag is not None:  # the filter the kernel writes from wa, and its grid barrier's counter
            if any(self._flags[1:]) or cfg.block_n != BLOCKDIAG_TILE_N:  # variants without the writer (SM90_BLOCKDIAG)
                raise RuntimeError("cuconv: a block-diagonal filter needs a plain 16-bit variant of the Hopper "
                                   "kernel with 64-filter tiles, not a float32, phase-storing, MN-major or wider one")
            taps, cg = self.blockdiag
            import cupy as cp
            dst = scratch("sm90 block-diagonal filter", problem.w_shape, "uint16")
            sync = cp.zeros((1,), dtype=np.uint64)
            bd = BlockDiag(wa.data.ptr, dst.data.ptr, sync.data.ptr, problem.out_channels * taps, taps, cg)
            bd_buffers, wa_tma = (dst, sync), dst
        else:
            wa_tma = wa
        if self.b_mn:
            tmap_w = encode_mn_w(problem, wa.data.ptr, self.mn_filter, BLOCK_K)
        else:
            tmap_w = encode_tiled_w(problem, wa_tma.data.ptr, cfg.block_n // cfg.cluster, BLOCK_K)  # one CTA's share
        bias_ptr = np.uint64(ba.data.ptr if ba is not None else xa.data.ptr)  # unread without a bias
        partials, flags = _split_workspace(cfg)
        res_ptr = ra.data.ptr if (res and direct) else 0
        table_ptr = 0
        if self.phase_scatter is not None:  # kept with the plan: its launch records hold the address
            self._phase_table = phase_table(self.device.index, self.phase_scatter.offsets)
            table_ptr = self._phase_table.data.ptr
        taps_ptr = 0
        if self.b_mn:  # kept with the plan, as the phase table
            self._tap_table = tap_table(self.device.index, self.mn_filter)
            taps_ptr = self._tap_table.data.ptr
        args = (tmap_x, tmap_w, tmap_c, np.uint64(0), bias_ptr,
                kernel_params(problem, cfg, res_ptr, self.x_channels, self.phase_scatter, table_ptr,
                              self.mn_filter, taps_ptr, self.groups, bd),
                epilogue_params(problem.epilogue), np.uint64(partials.data.ptr), np.uint64(flags.data.ptr))
        launch = PackedLaunch(fn, grid_ctas, cfg.threads, smem, args, slots=(3,))  # slot 3: the output pointer
        launch.workspace = (partials, flags) + bd_buffers  # live as long as the launch record
        return launch, cacheable, (xa, wa, ra, ba)


def _aligned(a, align: int = 16):
    """``a`` itself when its device address is ``align``-byte aligned, else an aligned copy."""
    return a if a.data.ptr % align == 0 else a.copy()


def _split_workspace(cfg: TileConfig):
    """(partials, flags) of a split-tail launch on the current device and stream (small placeholders when
    nothing is split): one fp32 tile per PARTIAL part, and one flag per consumer warp per PARTIAL part, zero
    between launches (kernels_cu/sm90/split_reduce.cuh). Both are :mod:`cuconv.scratch` buffers, one per
    (device, stream); a launch record keeps the views it was built with alive."""
    slots = cfg.split_tiles * (cfg.split_ways - 1)  # one per PARTIAL part
    nflt = slots * cfg.block_m * cfg.block_n
    nflag = slots * 4 * cfg.consumers
    return (scratch("sm90_split_partials", (max(nflt, 4),), "float32"),
            scratch("sm90_split_flags", (max(nflag, 1),), "int32", zeroed=True))


def _max_active_clusters(fn, cfg: TileConfig, smem: int, dev) -> int:
    """Clusters of ``cfg.cluster`` CTAs the device runs at once (the persistent grid's cap): the SM
    count for single CTAs; pairs must sit in one GPC, so the driver is asked
    (cuOccupancyMaxActiveClusters) once per plan."""
    sms = dev.sm_count or 132
    if cfg.cluster == 1:
        return sms
    drv = cuda_driver()
    conf = drv.CUlaunchConfig()
    conf.gridDimX, conf.gridDimY, conf.gridDimZ = cfg.cluster * (sms // cfg.cluster), 1, 1
    conf.blockDimX, conf.blockDimY, conf.blockDimZ = cfg.threads, 1, 1
    conf.sharedMemBytes = smem
    conf.numAttrs = 0
    err, n = drv.cuOccupancyMaxActiveClusters(drv.CUfunction(fn.kernel.ptr), conf)
    if int(err) != 0 or int(n) < 1:
        raise RuntimeError(f"cuconv: cuOccupancyMaxActiveClusters failed for {kernel_name(cfg, False)}: {err}")
    return int(n)


register(Sm90TmaKernel())
register(Sm90TmaConv3d())
