"""Config fields nothing reads are rejected: each component declares the fields it reads, and a non-default
value in a field that the chosen components never read is an error naming the field and the component --
so a sweep over such a field cannot produce identical arms under different labels. Defaults always pass:
every preset loads. Plus the cross-field checks of the filters and check_against_rollout."""

import dataclasses

import pytest

from objbench import algos
from objbench.algos.config import AdvantageConfig, FilterConfig, KLConfig, ObjectiveConfig
from objbench.algos.config_dict import check_against_rollout, with_overrides
from objbench.algos.settings import _SLOTS, _readers, fields_read

# a valid non-default value for every field some component choice reads
NON_DEFAULT = {
    "adv.scale": "batch",
    "adv.eps": 1e-4,
    "adv.gamma": 0.9,
    "adv.lam": 0.95,
    "adv.whiten": False,
    "value.coef": 0.5,
    "value.cliprange": None,
    "value.lr_scale": 2.0,
    "ratio.eps_low": 0.1,
    "ratio.eps_high": 0.28,
    "ratio.dual_clip": 3.0,
    "ratio.eps_low_is": 0.2,
    "ratio.eps_high_is": 1.0,
    "ratio.tau_pos": 2.0,
    "ratio.tau_neg": 2.0,
    "loss.max_len": 16,
    "kl.estimator": "k2",
    "kl.beta": 0.1,
    "kl.clamp": 10.0,
    "kl.reward_zero_var_check": "outcome",
    "filters.max_rounds": 3,
    "filters.overlong_cache": 8,
    "filters.overlong_factor": 0.5,
    "adv.alpha": 0.25,
    "filters.top_fraction": 0.5,
    "filters.top_min_keep": 2,
    "filters.correction_share": 0.25,
    "filters.correction_factor": 0.5,
    "groups.thresholds": [2.0],
    "groups.sizes": [4, 12],
    "groups.ema": 0.25,
    "groups.prior": 0.75,
}
# settings a member needs before it can be chosen at all (a rule with sizes needs sizes)
COMPANIONS = {("groups.rule", "difficulty"): {"groups.thresholds": [2.0], "groups.sizes": [4, 12]},
              ("groups.rule", "pass_rate"): {"groups.thresholds": [2.0], "groups.sizes": [4, 12]}}


def test_every_governed_field_has_a_test_value_and_one_slot():
    readers = _readers()
    assert set(readers) == set(NON_DEFAULT)
    for path, rs in readers.items():
        assert len({slot for slot, _ in rs}) == 1, path  # each field belongs to exactly one component slot
        head, _, name = path.partition(".")
        default = getattr(getattr(ObjectiveConfig(), head), name)
        assert NON_DEFAULT[path] != default, path


def _with_member(slot, member):
    return with_overrides(ObjectiveConfig(), {slot: member, **COMPANIONS.get((slot, member), {})})


@pytest.mark.parametrize("slot,member", [(s, m) for s, cands, _ in _SLOTS for m in cands()])
def test_each_component_accepts_what_it_reads_and_rejects_the_rest(slot, member):
    base = _with_member(slot, member)
    read = fields_read(base)
    for path, rs in _readers().items():
        if rs[0][0] != slot:
            continue
        if path in read:
            if path in COMPANIONS.get((slot, member), {}):
                continue  # already non-default in base
            with_overrides(base, {path: NON_DEFAULT[path]})  # accepted
        else:
            # (kl.beta > 0 with placement none has its own KLConfig message: "KLConfig.beta = ...")
            pattern = r"KLConfig\.beta" if path == "kl.beta" else path.replace(".", r"\.")
            with pytest.raises(ValueError, match=pattern) as err:
                with_overrides(base, {path: NON_DEFAULT[path]})
            msg = str(err.value)
            if path != "kl.beta":
                assert f"is not read by {slot} = {member!r}" in msg and "default" in msg, msg


@pytest.mark.parametrize(
    "overrides,message",
    [
        # the examples of the issue: rloo with group-std settings, GAE settings and a critic
        ({"adv.estimator": "rloo", "adv.scale": "none"}, r"adv\.scale = 'none' is not read by adv\.estimator = 'rloo'"),
        ({"adv.estimator": "rloo", "adv.eps": 5.0}, r"adv\.eps = 5\.0 is not read by adv\.estimator = 'rloo'"),
        ({"adv.estimator": "rloo", "adv.gamma": 0.5}, r"adv\.gamma = 0\.5 is not read by adv\.estimator = 'rloo' "
                                                       r"\(only adv\.estimator in \['gae', 'hybrid'\] reads it\)"),
        ({"value.coef": 0.5}, r"value\.coef = 0\.5 is not read by adv\.estimator = 'group'"),
        ({"value.cliprange": 0.2}, r"value\.cliprange = 0\.2 is not read by adv\.estimator = 'group'"),
        ({"value.lr_scale": 3.0}, r"value\.lr_scale"),
        ({"adv.estimator": "gae", "group_size": 1, "adv.scale": "batch"}, r"adv\.scale = 'batch' is not read by adv\.estimator = 'gae'"),
        ({"ratio.surrogate": "cispo", "ratio.eps_high": 0.28}, r"ratio\.eps_high = 0\.28 is not read by ratio\.surrogate = 'cispo'"),
        ({"ratio.surrogate": "sapo", "ratio.dual_clip": 3.0}, r"ratio\.dual_clip = 3\.0 is not read by ratio\.surrogate = 'sapo'"),
        ({"ratio.tau_neg": 2.0}, r"ratio\.tau_neg = 2\.0 is not read by ratio\.surrogate = 'ppo_clip'"),
        ({"loss.agg": "token_mean", "loss.max_len": 12}, r"loss\.max_len = 12 is not read by loss\.agg = 'token_mean'"),
        ({"kl.estimator": "k1"}, r"kl\.estimator = 'k1' is not read by kl\.placement = 'none'"),
        ({"kl.clamp": 10.0}, r"kl\.clamp = 10\.0 is not read by kl\.placement = 'none'"),
        ({"kl.placement": "loss", "kl.beta": 0.1, "kl.reward_zero_var_check": "outcome"},
         r"kl\.reward_zero_var_check = 'outcome' is not read by kl\.placement = 'loss'"),
        ({"adv.estimator": "gae", "kl.placement": "reward", "kl.estimator": "k1", "kl.beta": 0.1,
          "kl.reward_zero_var_check": "outcome"},
         r"kl\.reward_zero_var_check = 'outcome' is not read by adv\.estimator = 'gae'.*\['group', 'rloo'\]"),
        ({"filters.max_rounds": 5}, r"filters\.max_rounds = 5 is not read by filters\.dynamic_sampling = False"),
        ({"filters.overlong_cache": 8}, r"filters\.overlong_cache = 8 is not read by filters\.overlong_penalty = False"),
        ({"filters.overlong_factor": 0.5}, r"filters\.overlong_factor"),
    ],
)
def test_unread_fields_are_rejected_naming_field_and_component(overrides, message):
    with pytest.raises(ValueError, match=message):
        with_overrides(ObjectiveConfig(), overrides)


def test_the_same_values_pass_where_a_component_reads_them():
    with_overrides(ObjectiveConfig(), {"adv.estimator": "gae", "adv.gamma": 0.5, "value.coef": 0.5, "group_size": 1})
    with_overrides(ObjectiveConfig(), {"adv.eps": 5.0})  # group estimator, scale group
    with_overrides(ObjectiveConfig(), {"ratio.surrogate": "cispo", "ratio.eps_high_is": 3.0})
    with_overrides(ObjectiveConfig(), {"loss.agg": "seq_mean_token_sum_norm", "loss.max_len": 12})
    with_overrides(ObjectiveConfig(), {"kl.placement": "loss", "kl.estimator": "k1", "kl.clamp": 10.0})
    with_overrides(ObjectiveConfig(), {"kl.placement": "reward", "kl.beta": 0.04, "kl.reward_zero_var_check": "outcome"})
    with_overrides(ObjectiveConfig(), {"adv.estimator": "rloo", "kl.placement": "reward", "kl.beta": 0.04,
                                       "kl.reward_zero_var_check": "outcome"})
    with_overrides(ObjectiveConfig(), {"filters.dynamic_sampling": True, "filters.max_rounds": 5})
    with_overrides(ObjectiveConfig(), {"filters.overlong_penalty": True, "filters.overlong_cache": 8})
    # a zero-strength arm of a beta sweep still reads the KL settings (kl_estimators sweep's beta 0 arms)
    with_overrides(ObjectiveConfig(), {"kl.placement": "loss", "kl.beta": 0.0, "kl.estimator": "k1"})


def test_eps_is_not_read_without_a_std():
    with pytest.raises(ValueError, match=r"AdvantageConfig\.eps = 0\.0001 is not read with AdvantageConfig\.scale 'none'"):
        AdvantageConfig(scale="none", eps=1e-4)
    AdvantageConfig(scale="none")  # the default eps passes (Dr. GRPO)
    AdvantageConfig(scale="batch", eps=1e-4)


def test_overlong_penalty_needs_a_soft_zone_and_a_factor():
    with pytest.raises(ValueError, match=r"FilterConfig\.overlong_cache must be >= 1 with overlong_penalty"):
        FilterConfig(overlong_penalty=True, overlong_cache=0)
    with pytest.raises(ValueError, match=r"FilterConfig\.overlong_factor must be > 0 with overlong_penalty"):
        FilterConfig(overlong_penalty=True, overlong_factor=0.0)
    FilterConfig(overlong_cache=0)  # with the penalty off nothing reads it, and 0 ... is not its default:
    with pytest.raises(ValueError, match=r"filters\.overlong_cache = 0 is not read"):
        ObjectiveConfig(filters=FilterConfig(overlong_cache=0))


# ------------------------------------------------------------------------------------------- defaults
def test_defaults_and_every_preset_load():
    ObjectiveConfig()
    for name, cfg in algos.presets.items():
        assert algos.get_preset(name) == cfg
        # rebuilding every section from its fields re-runs all validation
        rebuilt = ObjectiveConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
        assert rebuilt == cfg
        for path in _readers():  # the unread fields of a preset are at their defaults
            if path not in fields_read(cfg):
                head, _, field_name = path.partition(".")
                assert getattr(getattr(cfg, head), field_name) == getattr(getattr(ObjectiveConfig(), head), field_name)


def test_fields_read_names_the_reader():
    read = fields_read(algos.presets["ppo"])
    assert read["adv.gamma"] == "adv.estimator='gae'" and read["value.cliprange"] == "adv.estimator='gae'"
    assert read["kl.reward_zero_var_check"] == "kl.placement='reward'"
    assert "adv.scale" not in read and "loss.max_len" not in read
    dapo = fields_read(algos.presets["dapo"])
    assert dapo["filters.max_rounds"] == "filters.dynamic_sampling=True"
    assert dapo["filters.overlong_cache"] == "filters.overlong_penalty=True"


def test_experiment_configs_reject_unread_fields_too():
    pytest.importorskip("omegaconf")
    from objbench.experiments.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"adv\.eps = 5\.0 is not read by adv\.estimator = 'rloo'"):
        load_config(None, ["objective.adv.estimator=rloo", "objective.adv.eps=5"])
    with pytest.raises(ConfigError, match=r"value\.coef"):
        load_config(None, ["objective=grpo", "objective.value.coef=0.5"])


# ----------------------------------------------------------------------------------- against rollout
def test_check_against_rollout():
    dapo = algos.presets["dapo"]  # overlong_cache 4
    check_against_rollout(dapo, 5)  # L_exp = 1
    with pytest.raises(ValueError, match=r"objective\.filters\.overlong_cache = 4 must be < rollout\.max_new_tokens = 4"):
        check_against_rollout(dapo, 4)
    with pytest.raises(ValueError, match="overlong_cache = 4 must be < rollout.max_new_tokens = 3"):
        check_against_rollout(dapo, 3)
    check_against_rollout(algos.presets["grpo"], 1)  # no penalty: nothing to check
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(ValueError, match="max_new_tokens must be the resolved maximum response length"):
            check_against_rollout(dapo, bad)
    assert KLConfig().reward_zero_var_check == "shaped"
