"""The report's pairwise section: each comparison (``posenc.lab.pairwise``) as a sentence
that states the seed-level result (``posenc.lab.seedlevel``) and, beside it, the
text-sampling test (``posenc.lab.significance``), with what separates the two.

A pair is "better than" only when the seed-level test says so; a pair the text-sampling
test calls significant while the seeds do not is "significant on this text, not across
seeds": these models differ on this text, but another training seed could reverse the
order.
"""

from __future__ import annotations

from posenc.lab.pairwise import Comparison
from posenc.lab.significance import EXACT_UNITS, PERMUTATIONS

__all__ = ["comparisons_record", "pairwise_lines", "sentence"]


def _where(length: int, train_len: int) -> str:
    return "the training length" if length == train_len else f"{length / train_len:g}x training"


def _p(adjusted: float, raw: float, floor: float, draws: bool) -> str:
    """``p_Holm = x``, saying when ``raw`` sits at the test's floor (the smallest p it
    can give; with random ``draws`` the true p may be smaller, and Holm's product is
    then an upper bound)."""
    if raw > floor * (1 + 1e-9):
        return f"p_Holm = {adjusted:.2g}"
    what = "Monte Carlo floor" if draws else "floor"
    return f"p_Holm = {adjusted:.2g} (p at its {what} {floor:.2g})"


def _interval(c: Comparison, low: float, high: float) -> str:
    return f"[{low:.3f}, {high:.3f}]" if c.metric == "ppl" else f"[{low:+.1f}, {high:+.1f}]"


def _effect(c: Comparison) -> str:
    return f"perplexity x{c.effect:.3f}" if c.metric == "ppl" else f"{c.effect:+.1f} points"


def sentence(c: Comparison) -> str:
    """``"A better than B (seeds: p, effect [interval], wins; sign flips: p; text: p,
    [interval])"``,
    ``"A vs B: significant on this text, not across seeds (...)"`` (the text-sampling
    test's p_Holm < 0.05) or ``"A vs B: not separated (...)"``; both p-values
    Holm-corrected."""
    seeds = (
        f"seeds: p_Holm = {c.p_seed_holm:.2g} (mixed model, {c.seed_df:.1f} df), "
        f"{_effect(c)} {_interval(c, c.seed_low, c.seed_high)}, better in "
        f"{c.wins}/{c.seeds} seeds"
    )
    at = " (its floor)" if c.p_flip <= c.flip_floor * (1 + 1e-9) else ""
    flips = f"sign flips: p = {c.p_flip:.2g}{at}, uncorrected"
    text = f"text: {_p(c.p_holm, c.p, c.text_floor, c.units > EXACT_UNITS)}"
    detail = f"{seeds}; {flips}; {text}, {_interval(c, c.low, c.high)}"
    if c.separated:
        return f"{c.first} better than {c.second} ({detail})"
    if c.p_holm < 0.05:
        on = "this text" if c.metric == "ppl" else "these examples"
        return f"{c.first} vs {c.second}: significant on {on}, not across seeds ({detail})"
    return f"{c.first} vs {c.second}: not separated ({detail})"


def comparisons_record(comparisons: list[Comparison]) -> list[dict[str, object]]:
    """What ``results.json`` keeps of the pairwise tests: each comparison's fields."""
    return [c.to_dict() for c in comparisons]


def pairwise_lines(results: dict, comparisons: list[Comparison]) -> list[str]:
    """The report's section: how the two tests work and differ, then every pair at
    every length, separated pairs first."""
    if not comparisons:
        return []
    units = "segments" if results["metric"] == "ppl" else "examples"
    on, sampled = (
        ("this text", "text was") if units == "segments" else ("these examples", "examples were")
    )
    model = (
        "A mixed-effects model of the per-(seed, file) mean differences with seeds and "
        "held-out files as crossed random effects (every seed is scored on the same "
        "files; ANOVA variance components, Satterthwaite's degrees of freedom): it "
        "generalises to other training seeds and other files of this kind."
        if units == "segments"
        else "Each seed draws its own examples, so the mixed model's test is the t-test "
        "of the per-seed mean differences on S - 1 degrees of freedom."
    )
    effect = (
        "perplexity ratio (exp of the mean per-byte loss difference)"
        if results["metric"] == "ppl"
        else "accuracy difference"
    )
    seeds = len(results["seeds"])
    lines = [
        f"Pairwise tests, every pair at every length; effect: {effect}. Three tests; the "
        f"first and the last are Holm-corrected over all {len(comparisons)} comparisons "
        "of this report:",
        "",
        f"- **Seed level** (the claims): the training run is the unit. {model} Its "
        "p-value and 95 % interval come from Student's t, so they have no floor; it "
        "assumes normal seed effects.",
        "- **Sign flips over seeds**, the check that assumes nothing: an exact test over "
        "the per-seed mean differences (every one of the 2^S sign patterns). With S seeds "
        f"its p cannot go below 2/2^S ({seeds} seed{'s' * (seeds != 1)} here: "
        f"{2 / 2**seeds:.2g}), so it confirms a direction but cannot rank claims; its p "
        "is shown uncorrected.",
        f"- **Text sampling**: a sign-flip test over (seed, {units[:-1]}) pairs (exact, or "
        f"{PERMUTATIONS:,} random flips) with a bootstrap over seeds and {units}. It takes "
        f"the trained models as given: it says whether these models differ on {on}, "
        "not whether another training seed would order them the same way, so it separates "
        "pairs whose per-seed differences change sign.",
        "",
        "'Better than' needs the mixed model's p_Holm < 0.05 and an interval that "
        f"excludes no difference. The table's intervals include which {sampled} sampled, "
        "so they overlap even where the paired tests separate two rows.",
        "",
    ]
    train_len = results["config"]["train_len"]
    for n in results["config"]["eval_lens"]:
        here = [c for c in comparisons if c.length == str(n)]
        if not here:
            continue
        split = sum(c.separated for c in here)
        text = sum(c.p_holm < 0.05 for c in here)
        lines += [
            f"At {n} ({_where(n, train_len)}), {split} of {len(here)} pairs separated across "
            f"seeds ({text} significant on {on}):",
            "",
        ]
        here.sort(key=lambda c: (not c.separated, c.p_holm >= 0.05, c.p_seed, c.p_holm))
        lines += [f"- {sentence(c)}" for c in here]
        lines.append("")
    return lines
