"""viz.plot_training (chapter 11's per-iteration loss and learning-rate curves)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_attn import viz  # noqa: E402
from course_attn.train import TrainConfig, TrainResult, learning_rate  # noqa: E402


def a_result(n: int = 12) -> TrainResult:
    config = TrainConfig(max_iters=n, lr=0.01, warmup_iters=2)
    return TrainResult(train_losses=[3.0 - 0.1 * i for i in range(n)],
                       learning_rates=[learning_rate(i, config) for i in range(n)],
                       eval_iters=[6, 12], eval_train_losses=[2.6, 2.0],
                       eval_val_losses=[2.5, 2.1])


def test_plot_training_draws_every_iteration_its_mean_the_evaluations_and_the_rate():
    result = a_result()
    loss_ax, lr_ax = viz.plot_training(result, smooth=4, floor=1.5, title="run")
    lines = {line.get_label(): line for line in loss_ax.get_lines()}
    raw, mean = lines["batch loss, every iteration"], lines["mean of the last 4 iterations"]
    np.testing.assert_array_equal(raw.get_xdata(), np.arange(1, 13))  # counted from 1
    np.testing.assert_allclose(raw.get_ydata(), result.train_losses)
    # a trailing mean: the first one covers iterations 1..4
    np.testing.assert_array_equal(mean.get_xdata(), np.arange(4, 13))
    np.testing.assert_allclose(mean.get_ydata()[0], np.mean(result.train_losses[:4]))
    np.testing.assert_allclose(mean.get_ydata()[-1], np.mean(result.train_losses[-4:]))
    val = lines["evaluation: validation split"]
    np.testing.assert_array_equal(val.get_xdata(), [6, 12])
    np.testing.assert_allclose(val.get_ydata(), [2.5, 2.1])
    np.testing.assert_allclose(lines["evaluation: training split"].get_ydata(), [2.6, 2.0])
    assert lines["theory: floor"].get_linestyle() == "--"
    np.testing.assert_allclose(lines["theory: floor"].get_ydata(), [1.5, 1.5])
    (rate,) = lr_ax.get_lines()
    np.testing.assert_allclose(rate.get_ydata(), result.learning_rates)
    assert loss_ax.get_title() == "run" and lr_ax.get_xlabel() == "iteration"
    assert loss_ax.figure is lr_ax.figure and loss_ax.figure.get_size_inches()[0] <= 7.2
    plt.close(loss_ax.figure)


def test_plot_training_draws_on_given_axes_and_shortens_the_window_for_short_runs():
    fig, axes = plt.subplots(1, 2)
    drawn = viz.plot_training(a_result(3), axes=list(axes), smooth=50)
    assert drawn == list(axes)
    labels = [line.get_label() for line in axes[0].get_lines()]
    assert "mean of the last 3 iterations" in labels and "theory: floor" not in labels
    plt.close(fig)


@pytest.mark.parametrize(
    "change, error, phrase",
    [
        (lambda r: object(), TypeError, r"result must be a TrainResult .* without"),
        (lambda r: TrainResult(), ValueError, r"train_losses must be a non-empty list"),
        (lambda r: TrainResult(train_losses=[1.0, 2.0], learning_rates=[0.1]), ValueError,
         r"learning_rates must have one entry per iteration \(2\)"),
        (lambda r: TrainResult(train_losses=[1.0], learning_rates=[0.1], eval_iters=[1]),
         ValueError, r"eval_train_losses must have one entry per evaluation \(1\)"),
    ],
)
def test_plot_training_bad_results(change, error, phrase):
    with pytest.raises(error, match=phrase):
        viz.plot_training(change(a_result()))


@pytest.mark.parametrize(
    "options, error, phrase",
    [
        (dict(smooth=0), ValueError, r"smooth must be a positive int"),
        (dict(smooth=2.5), ValueError, r"smooth must be a positive int"),
        (dict(floor=float("nan")), TypeError, r"floor must be a finite number or None"),
        (dict(floor="1.3"), TypeError, r"floor must be a finite number or None"),
        (dict(axes="ab"), TypeError, r"axes must be a matplotlib Axes"),
    ],
)
def test_plot_training_bad_options(options, error, phrase):
    with pytest.raises(error, match=phrase):
        viz.plot_training(a_result(), **options)
    plt.close("all")


def test_plot_training_needs_two_axes():
    fig, ax = plt.subplots()
    with pytest.raises(TypeError, match=r"axes must be a sequence of 2 matplotlib Axes"):
        viz.plot_training(a_result(), axes=[ax])
    plt.close(fig)


# ------------------------------------------------- viz.plot_training_and_scores (chapter 11)
def test_plot_training_and_scores_aligns_the_losses_and_the_scores_on_one_axis():
    its = [0, 20, 40]
    losses = {"validation": [2.3, 1.9, 1.3]}
    scores = {"previous-token": [0.1, 0.9, 0.9], "induction": [0.1, 0.1, 0.95]}
    loss_ax, score_ax = viz.plot_training_and_scores(its, losses, scores, floor=1.28,
                                                     title="recall")
    lines = {line.get_label(): line for line in loss_ax.get_lines()}
    np.testing.assert_array_equal(lines["validation"].get_xdata(), its)
    np.testing.assert_allclose(lines["validation"].get_ydata(), losses["validation"])
    assert lines["theory: floor"].get_linestyle() == "--"
    np.testing.assert_allclose(lines["theory: floor"].get_ydata(), [1.28, 1.28])
    drawn = {line.get_label(): line for line in score_ax.get_lines()}
    assert set(drawn) == set(scores)
    np.testing.assert_allclose(drawn["induction"].get_ydata(), scores["induction"])
    assert score_ax.get_ylim() == (0, 1.05) and score_ax.get_xlabel() == "iteration"
    assert loss_ax.get_shared_x_axes().joined(loss_ax, score_ax)  # one axis of iterations
    assert loss_ax.get_title() == "recall" and loss_ax.figure.get_size_inches()[0] <= 7.2
    plt.close(loss_ax.figure)


def test_plot_training_and_scores_draws_on_given_axes_without_a_floor():
    fig, axes = plt.subplots(2, 1)
    drawn = viz.plot_training_and_scores([1, 2], {"loss": [2.0, 1.0]}, {"s": [0.0, 1.0]},
                                         axes=list(axes), score_label="score")
    assert drawn == list(axes) and axes[1].get_ylabel() == "score"
    assert [line.get_label() for line in axes[0].get_lines()] == ["loss"]
    plt.close(fig)


@pytest.mark.parametrize(
    "args, options, error, phrase",
    [
        (([1, 2], [1.0, 2.0], {"s": [0.1, 0.2]}), {}, TypeError, r"losses must be a non-empty"),
        (([1, 2], {"l": [1.0, 2.0]}, {}), {}, TypeError, r"scores must be a non-empty"),
        (([1, 2], {"l": [1.0]}, {"s": [0.1, 0.2]}), {}, ValueError,
         r"losses\['l'\] must have one value per iteration"),
        (([[1, 2]], {"l": [1.0]}, {"s": [0.1]}), {}, ValueError, r"iterations must be"),
        (([1, 2], {"l": [1.0, 2.0]}, {"s": [0.1, 0.2]}), dict(floor="1"), TypeError,
         r"floor must be a finite number"),
        (([1, 2], {"l": [1.0, 2.0]}, {"s": [0.1, 0.2]}), dict(axes="ab"), TypeError,
         r"axes must be"),
    ],
)
def test_plot_training_and_scores_bad_arguments(args, options, error, phrase):
    with pytest.raises(error, match=phrase):
        viz.plot_training_and_scores(*args, **options)
    plt.close("all")
