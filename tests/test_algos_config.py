"""algos.config, algos.presets, algos.registry: validation names the field, OmegaConf contract, published
preset values, override helpers, registry errors and one-signature families."""

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

from objbench import algos
from objbench.algos.config import (
    AdvantageConfig,
    FilterConfig,
    GroupConfig,
    KLConfig,
    LossConfig,
    ObjectiveConfig,
    RatioConfig,
    ValueConfig,
)
from objbench.algos.config_dict import config_from_dict, config_to_dict, format_config_table, with_overrides
from objbench.algos.registry import ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, KL_ESTIMATORS, RATIO_LEVELS, Registry
from objbench.algos.schedules import Schedule, TemperatureControl

CONFIG_CLASSES = [AdvantageConfig, RatioConfig, LossConfig, KLConfig, ValueConfig, FilterConfig, GroupConfig,
                  ObjectiveConfig]


# ------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "make,field_name",
    [
        (lambda: AdvantageConfig(estimator="ppo"), "AdvantageConfig.estimator"),
        (lambda: AdvantageConfig(scale="std"), "AdvantageConfig.scale"),
        (lambda: AdvantageConfig(eps=-1e-6), "AdvantageConfig.eps"),
        (lambda: AdvantageConfig(gamma=1.5), "AdvantageConfig.gamma"),
        (lambda: AdvantageConfig(lam=-0.1), "AdvantageConfig.lam"),
        (lambda: RatioConfig(level="seq"), "RatioConfig.level"),
        (lambda: RatioConfig(eps_low=1.0), "RatioConfig.eps_low"),
        (lambda: RatioConfig(eps_low=-0.1), "RatioConfig.eps_low"),
        (lambda: RatioConfig(eps_high=-0.1), "RatioConfig.eps_high"),
        (lambda: RatioConfig(dual_clip=1.0), "RatioConfig.dual_clip"),
        (lambda: LossConfig(agg="mean"), "LossConfig.agg"),
        (lambda: LossConfig(max_len=0), "LossConfig.max_len"),
        (lambda: KLConfig(estimator="k4"), "KLConfig.estimator"),
        (lambda: KLConfig(placement="both"), "KLConfig.placement"),
        (lambda: KLConfig(placement="loss", beta=-1.0), "KLConfig.beta"),
        (lambda: KLConfig(beta=0.1), "KLConfig.beta"),  # beta > 0 with placement none
        (lambda: KLConfig(placement="reward", estimator="k3_ratio", beta=0.1), "KLConfig.estimator"),
        (lambda: KLConfig(placement="reward", estimator="k3_k2grad", beta=0.1), "KLConfig.estimator"),
        (lambda: KLConfig(clamp=0.0), "KLConfig.clamp"),
        (lambda: ValueConfig(cliprange=0.0), "ValueConfig.cliprange"),
        (lambda: ValueConfig(lr_scale=0.0), "ValueConfig.lr_scale"),
        (lambda: FilterConfig(max_rounds=0), "FilterConfig.max_rounds"),
        (lambda: FilterConfig(overlong_cache=-1), "FilterConfig.overlong_cache"),
        (lambda: ObjectiveConfig(group_size=1), "ObjectiveConfig.group_size"),  # group estimator, G = 1
        (lambda: ObjectiveConfig(group_size=1, adv=AdvantageConfig(estimator="rloo")), "ObjectiveConfig.group_size"),
        (lambda: ObjectiveConfig(group_size=1, adv=AdvantageConfig(estimator="gae"),
                                 filters=FilterConfig(dynamic_sampling=True)), "ObjectiveConfig.group_size"),
        (lambda: ObjectiveConfig(n_minibatches=0), "ObjectiveConfig.n_minibatches"),
        (lambda: ObjectiveConfig(n_epochs=0), "ObjectiveConfig.n_epochs"),
        # types
        (lambda: ObjectiveConfig(group_size=8.0), "ObjectiveConfig.group_size"),
        (lambda: ObjectiveConfig(group_size=True), "ObjectiveConfig.group_size"),
        (lambda: AdvantageConfig(whiten=1), "AdvantageConfig.whiten"),
        (lambda: RatioConfig(eps_low="0.2"), "RatioConfig.eps_low"),
        (lambda: LossConfig(agg=None), "LossConfig.agg"),
        (lambda: ObjectiveConfig(ratio={"eps_low": 0.1}), "ObjectiveConfig.ratio"),
    ],
)
def test_validation_errors_name_the_field(make, field_name):
    with pytest.raises(ValueError, match=field_name.replace(".", r"\.")):
        make()


def test_choice_errors_list_the_valid_choices():
    with pytest.raises(ValueError, match="gae.*group.*rloo"):
        AdvantageConfig(estimator="ppo")
    with pytest.raises(ValueError, match="seq_mean_token_mean.*token_mean"):
        LossConfig(agg="mean")
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        KLConfig(placement="reward", estimator="k3_ratio", beta=0.1)


def test_valid_edge_cases_and_int_to_float():
    ObjectiveConfig(group_size=1, adv=AdvantageConfig(estimator="gae"))  # gae allows one sample per prompt
    KLConfig(placement="loss", beta=0.0)  # a zero-strength KL arm of a beta sweep is allowed
    assert RatioConfig(eps_high=1).eps_high == 1.0 and isinstance(RatioConfig(eps_high=1).eps_high, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ObjectiveConfig().group_size = 4


# ------------------------------------------------------------------------------------- OmegaConf contract
ALLOWED = {str, int, float, bool}
# the container types OmegaConf handles that the configs use: lists of numbers, the schedules mapping and the plug-in
# members' options (member -> setting -> value)
CONTAINERS = {typing.List[float], typing.List[int], typing.Dict[str, typing.Dict[str, Schedule]],
              typing.Dict[str, typing.Dict[str, typing.Any]]}


@pytest.mark.parametrize("cls", CONFIG_CLASSES + [Schedule, TemperatureControl])
def test_field_types_are_omegaconf_friendly(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            assert len(args) == 1 and args[0] in ALLOWED, f"{cls.__name__}.{f.name}: {tp}"
        elif dataclasses.is_dataclass(tp) or tp in CONTAINERS:
            assert f.default_factory is not dataclasses.MISSING, f"{cls.__name__}.{f.name} needs default_factory"
        else:
            assert tp in ALLOWED, f"{cls.__name__}.{f.name}: {tp}"
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def test_every_field_has_a_docstring():
    tree = ast.parse(Path(inspect.getsourcefile(ObjectiveConfig)).read_text())
    names = {c.__name__ for c in CONFIG_CLASSES}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in names:
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), \
                        f"{node.name}.{stmt.target.id} has no doc string"


def test_omegaconf_round_trip():
    omegaconf = pytest.importorskip("omegaconf")
    OmegaConf = omegaconf.OmegaConf
    for cfg in algos.presets.values():
        sc = OmegaConf.structured(cfg)
        merged = OmegaConf.merge(sc, OmegaConf.from_dotlist(["loss.agg=token_mean", "ratio.eps_high=0.28"]))
        obj = OmegaConf.to_object(merged)
        assert isinstance(obj, ObjectiveConfig)
        assert obj == with_overrides(cfg, {"loss.agg": "token_mean", "ratio.eps_high": 0.28})


# ------------------------------------------------------------------------------------------------ presets
def test_presets_have_the_published_values():
    p = algos.presets
    assert set(p) == {"ppo", "grpo", "dr_grpo", "dapo", "gspo"}
    ppo = p["ppo"]
    assert (ppo.adv.estimator, ppo.adv.gamma, ppo.adv.lam, ppo.adv.whiten) == ("gae", 1.0, 1.0, True)
    assert (ppo.ratio.level, ppo.ratio.eps_low, ppo.ratio.eps_high) == ("token", 0.2, 0.2)
    assert ppo.loss.agg == "token_mean" and ppo.group_size == 1 and ppo.value.cliprange == 0.5
    assert (ppo.kl.estimator, ppo.kl.placement, ppo.kl.beta) == ("k1", "reward", 0.001)

    grpo = p["grpo"]
    assert (grpo.adv.estimator, grpo.adv.scale) == ("group", "group")
    assert (grpo.ratio.level, grpo.ratio.eps_low, grpo.ratio.eps_high) == ("token", 0.2, 0.2)
    assert grpo.loss.agg == "seq_mean_token_mean"
    assert (grpo.kl.estimator, grpo.kl.placement, grpo.kl.beta) == ("k3", "loss", 0.04)

    dr = p["dr_grpo"]
    assert (dr.adv.estimator, dr.adv.scale) == ("group", "none")
    assert dr.loss.agg == "seq_mean_token_sum_norm" and dr.kl.placement == "none" and dr.kl.beta == 0.0
    assert (dr.ratio.eps_low, dr.ratio.eps_high) == (0.2, 0.2)

    dapo = p["dapo"]
    assert (dapo.adv.scale, dapo.ratio.eps_low, dapo.ratio.eps_high) == ("group", 0.2, 0.28)
    assert dapo.loss.agg == "token_mean" and dapo.kl.placement == "none" and dapo.kl.beta == 0.0
    assert dapo.filters.dynamic_sampling and dapo.filters.overlong_penalty and dapo.filters.max_rounds == 10
    assert dapo.filters.overlong_factor == 1.0

    gspo = p["gspo"]
    assert (gspo.ratio.level, gspo.ratio.eps_low, gspo.ratio.eps_high) == ("sequence", 3e-4, 4e-4)
    assert gspo.loss.agg == "seq_mean_token_mean" and gspo.n_minibatches == 4 and gspo.kl.placement == "none"

    # G is the one value scaled down: the same for every group method (budget parity)
    assert {p[n].group_size for n in ("grpo", "dr_grpo", "dapo", "gspo")} == {8}
    # no preset uses the dual clip or an entropy bonus
    assert all(c.ratio.dual_clip is None and c.loss.entropy_coef == 0.0 for c in p.values())
    assert all(name == cfg.name for name, cfg in p.items())


def test_presets_are_read_only():
    with pytest.raises(TypeError):
        algos.presets["mine"] = ObjectiveConfig()
    with pytest.raises(TypeError):
        del algos.presets["grpo"]


def test_get_preset_and_overrides():
    cfg = algos.get_preset("grpo", group_size=4, loss__agg="token_mean", ratio__eps_high=0.28)
    assert (cfg.group_size, cfg.loss.agg, cfg.ratio.eps_high) == (4, "token_mean", 0.28)
    assert algos.presets["grpo"].group_size == 8  # the preset itself is untouched
    assert algos.get_preset("gspo") is algos.presets["gspo"]
    with pytest.raises(ValueError, match="ppo.*grpo.*dr_grpo.*dapo.*gspo"):
        algos.get_preset("reinforce")
    with pytest.raises(ValueError, match=r"RatioConfig\.eps_low"):
        algos.get_preset("grpo", ratio__eps_low=1.5)  # overrides are validated
    with pytest.raises(ValueError, match="ObjectiveConfig.group_size"):
        algos.get_preset("grpo", group_size=1)


def test_with_overrides():
    base = algos.presets["dapo"]
    cfg = with_overrides(base, {"loss.agg": "seq_mean_token_mean", "filters": {"overlong_filter": True}})
    assert cfg.loss.agg == "seq_mean_token_mean" and cfg.filters.overlong_filter and cfg.filters.dynamic_sampling
    # several fields of one section change together (validated once): KL on in one step
    kl_on = with_overrides(base, {"kl.placement": "loss", "kl.beta": 0.01})
    assert (kl_on.kl.placement, kl_on.kl.beta) == ("loss", 0.01)
    with pytest.raises(ValueError, match="loss.aggregation"):
        with_overrides(base, {"loss.aggregation": "token_mean"})
    with pytest.raises(ValueError, match="valid fields.*group_size"):
        with_overrides(base, {"groupsize": 4})
    with pytest.raises(ValueError, match="section"):
        with_overrides(base, {"loss": "token_mean"})


def test_dict_round_trip_and_table():
    for cfg in algos.presets.values():
        assert config_from_dict(config_to_dict(cfg)) == cfg
    table = format_config_table(algos.presets["grpo"])
    lines = table.splitlines()
    n_leaves = sum(
        len(dataclasses.fields(getattr(ObjectiveConfig(), f.name))) if dataclasses.is_dataclass(getattr(ObjectiveConfig(), f.name)) else 1
        for f in dataclasses.fields(ObjectiveConfig)
    )
    assert len(lines) == n_leaves
    assert any(line.split() == ["loss.agg", "'seq_mean_token_mean'"] for line in lines)
    # two configs differing in one field differ in exactly one line of the table
    other = format_config_table(with_overrides(algos.presets["grpo"], {"loss.agg": "token_mean"})).splitlines()
    assert sum(a != b for a, b in zip(lines, other)) == 1


# ----------------------------------------------------------------------------------------------- registry
def test_registry_duplicate_and_unknown():
    reg = Registry("widget")
    reg.register("a", 1)

    @reg.register("b")
    def _b():
        return 2

    assert reg.get("a") == 1 and reg.get("b") is _b and reg.names() == ("a", "b") and "a" in reg and len(reg) == 2
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", 3)
    with pytest.raises(ValueError, match="unknown widget 'c'; valid names: a, b"):
        reg.get("c")
    assert [] not in reg  # unhashable lookups are just "not there"


def test_registry_families_are_complete():
    assert ADVANTAGE_ESTIMATORS.names() == ("gae", "group", "hybrid", "rloo")
    assert AGGREGATION_MODES.names() == ("seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_mean")
    assert KL_ESTIMATORS.names() == ("k1", "k2", "k3", "k3_k2grad", "k3_ratio")
    assert RATIO_LEVELS.names() == ("sequence", "sequence_token", "token")
    with pytest.raises(ValueError, match="valid names: k1, k2, k3"):
        KL_ESTIMATORS.get("k9")
    with pytest.raises(ValueError, match="already registered"):
        KL_ESTIMATORS.register("k1", lambda logp, ref_logp, old_logp=None: logp)


def _params(fn):
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_each_family_has_one_signature():
    for family, get_fn in (
        (ADVANTAGE_ESTIMATORS, lambda m: m.compute),
        (AGGREGATION_MODES, lambda m: m),
        (KL_ESTIMATORS, lambda m: m),
        (RATIO_LEVELS, lambda m: m.log_ratio),
    ):
        sigs = {tuple(_params(get_fn(family.get(n)))) for n in family.names()}
        assert len(sigs) == 1, (family.family, sigs)
