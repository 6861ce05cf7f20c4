"""A user's TensorFlow script: knowledge distillation (the Keras "Knowledge Distillation" recipe: a ``Distiller``
model wrapping a trained teacher and a small student, the student trained on a weighted sum of the hard-label loss and
the KL divergence between the teacher's and the student's softened outputs at a temperature) on synthetic 28x28
images of ten stroke patterns; Keras ``fit`` under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: two ``fit`` calls in one job (the teacher trained first for a
few epochs, its all-reduces before the profiled window; then the distiller, whose ``fit`` carries dagprof's callback),
a frozen model inside the trained one (the teacher called with ``training=False`` in the distiller's ``train_step``,
its variables not among the distiller's trainable ones, so only the student's gradients are all-reduced), a
``compile`` that takes the distiller's own extra arguments (``student_loss_fn``, ``distillation_loss_fn``, ``alpha``,
``temperature``) beside the optimizer and metrics, the losses made with ``reduction="none"`` and averaged over the
global batch by ``tf.nn.compute_average_loss`` (the recipe's own reduction is refused under a strategy), random
augmentation layers (``RandomTranslation``, ``RandomContrast``) at the head of both models, ``SeparableConv2D`` in
the student, and ``tf.data`` from numpy with ``AutoShardPolicy.DATA``. One line for dagprof: the callback. ``python tf_distill_fit.py --out RUN`` per worker,
TF_CONFIG set; needs tf-keras and ``TF_USE_LEGACY_KERAS=1``.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--teacher-epochs", type=int, default=2)
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--steps-per-epoch", type=int, default=12)
ap.add_argument("--batch", type=int, default=32, help="per worker")
ap.add_argument("--window", default="14:22")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
CLASSES, SIZE = 10, 28
GLOBAL = args.batch * strategy.num_replicas_in_sync


def strokes(n, seed):
    """Images of one of ten stroke patterns (a bar at one of five angles, thin or thick), shifted and noisy."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] - SIZE / 2
    y = rng.integers(0, CLASSES, n)
    angle = (y % 5)[:, None, None] * np.pi / 5
    width = np.where(y < 5, 1.5, 3.5)[:, None, None]
    dist = np.abs(np.cos(angle) * yy[None] - np.sin(angle) * xx[None] + rng.normal(0, 2, (n, 1, 1)))
    x = (dist < width).astype(np.float32) + 0.3 * rng.standard_normal((n, SIZE, SIZE)).astype(np.float32)
    return x[..., None], y.astype(np.int32)


def dataset(seed):
    x, y = strokes(2048, seed)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=seed).repeat()
    return ds.batch(GLOBAL, drop_remainder=True).prefetch(2).with_options(opts)


def augment():
    return [tf.keras.layers.RandomTranslation(0.1, 0.1), tf.keras.layers.RandomContrast(0.2)]


class Distiller(tf.keras.Model):
    def __init__(self, student, teacher):
        super().__init__()
        self.student, self.teacher = student, teacher

    def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3.0):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn, self.distillation_loss_fn = student_loss_fn, distillation_loss_fn
        self.alpha, self.temperature = alpha, temperature

    def train_step(self, data):
        x, y = data
        teacher_predictions = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            student_predictions = self.student(x, training=True)
            # per-example losses averaged over the global batch: a strategy refuses a Keras loss's own reduction here
            student_loss = tf.nn.compute_average_loss(self.student_loss_fn(y, student_predictions), global_batch_size=GLOBAL)
            distillation_loss = tf.nn.compute_average_loss(
                self.distillation_loss_fn(tf.nn.softmax(teacher_predictions / self.temperature, axis=1),
                                          tf.nn.softmax(student_predictions / self.temperature, axis=1)), global_batch_size=GLOBAL)
            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss * self.temperature ** 2
        grads = tape.gradient(loss, self.student.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.student.trainable_variables))
        self.compiled_metrics.update_state(y, student_predictions)
        results = {m.name: m.result() for m in self.metrics}
        results.update({"student_loss": student_loss, "distillation_loss": distillation_loss})
        return results

    def call(self, x):
        return self.student(x)


with strategy.scope():
    teacher = tf.keras.Sequential([tf.keras.Input((SIZE, SIZE, 1)), *augment(),
                                   tf.keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
                                   tf.keras.layers.Conv2D(128, 3, strides=2, padding="same", activation="relu"),
                                   tf.keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
                                   tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(256, activation="relu"),
                                   tf.keras.layers.Dense(CLASSES)], name="teacher")
    student = tf.keras.Sequential([tf.keras.Input((SIZE, SIZE, 1)), *augment(),
                                   tf.keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
                                   tf.keras.layers.SeparableConv2D(32, 3, strides=2, padding="same", activation="relu"),
                                   tf.keras.layers.Flatten(), tf.keras.layers.Dense(128, activation="relu"),
                                   tf.keras.layers.Dense(CLASSES)], name="student")
    teacher.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
teacher.fit(dataset(1), epochs=args.teacher_epochs, steps_per_epoch=args.steps_per_epoch, verbose=0)
with strategy.scope():
    distiller = Distiller(student=student, teacher=teacher)
    distiller.compile(optimizer=tf.keras.optimizers.Adam(2e-3), metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
                      student_loss_fn=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
                      distillation_loss_fn=tf.keras.losses.KLDivergence(reduction="none"), alpha=0.1, temperature=4.0)
history = distiller.fit(dataset(2), epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
                        callbacks=[keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
print(", ".join(f"{k} {v[-1]:.3f}" for k, v in history.history.items()), flush=True)
