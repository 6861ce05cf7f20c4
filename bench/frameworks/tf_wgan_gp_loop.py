"""A user's TensorFlow script: a WGAN-GP (Gulrajani et al. 2017) on synthetic 16x16 one-channel images, custom loop with
``strategy.run``.

Habits it exercises that the other TF scripts do not: two Keras models (a transposed-conv generator and a conv critic)
and two optimizers (Adam, beta_1 0, beta_2 0.9, as the paper), ``--critic-steps`` critic updates per generator update
inside one ``tf.function`` step (a Python loop the trace unrolls: several all-reduces of the critic's gradients and one
of the generator's), the gradient penalty by a tape nested inside the critic's tape (the critic's gradient with respect
to an interpolated batch, differentiated again), ``LeakyReLU`` and no normalisation in the critic, ``BatchNormalization``
in the generator, a ``tf.random.Generator`` made in the
strategy's scope (each replica draws its own stream), and the losses read as a
Python dict of ``.numpy()`` every 4 steps. dagprof is given the critic (``model=critic``): the model most of the bytes
belong to, as a user would pick one.
``python tf_wgan_gp_loop.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=64, help="per worker")
ap.add_argument("--critic-steps", type=int, default=3)
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL, LATENT, GP = args.batch * strategy.num_replicas_in_sync, 32, 10.0


def generator() -> tf.keras.Model:
    z = tf.keras.Input((LATENT,), name="z")
    h = tf.keras.layers.Dense(4 * 4 * 64, use_bias=False, name="project")(z)
    h = tf.keras.layers.Reshape((4, 4, 64))(tf.keras.layers.ReLU()(tf.keras.layers.BatchNormalization(name="bn0")(h)))
    for i, ch in enumerate((32, 16)):
        h = tf.keras.layers.Conv2DTranspose(ch, 4, strides=2, padding="same", use_bias=False, name=f"up{i}")(h)
        h = tf.keras.layers.ReLU()(tf.keras.layers.BatchNormalization(name=f"bn{i + 1}")(h))
    return tf.keras.Model(z, tf.keras.layers.Conv2D(1, 3, padding="same", activation="tanh", name="to_image")(h), name="generator")


def critic() -> tf.keras.Model:
    x = tf.keras.Input((16, 16, 1), name="image")
    h = x
    for i, ch in enumerate((16, 32, 64)):
        h = tf.keras.layers.LeakyReLU(0.2)(tf.keras.layers.Conv2D(ch, 4, strides=2, padding="same", name=f"down{i}")(h))
    return tf.keras.Model(x, tf.keras.layers.Dense(1, name="score")(tf.keras.layers.Flatten()(h)), name="critic")


with strategy.scope():
    gen, crit = generator(), critic()
    g_opt = tf.keras.optimizers.Adam(2e-4, beta_1=0.0, beta_2=0.9)
    c_opt = tf.keras.optimizers.Adam(2e-4, beta_1=0.0, beta_2=0.9)
    noise = tf.random.Generator.from_seed(1234)


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    """Blobs: a bright disc at a random place on a dim background, the shape a small GAN can learn."""
    rng = np.random.default_rng(5 + ctx.input_pipeline_id)
    n = 16 * args.batch
    yy, xx = np.mgrid[:16, :16]
    cy, cx, r = rng.uniform(4, 12, n), rng.uniform(4, 12, n), rng.uniform(2, 4, n)
    img = np.where((yy - cy[:, None, None]) ** 2 + (xx - cx[:, None, None]) ** 2 < r[:, None, None] ** 2, 0.9, -0.8)
    img = (img + 0.05 * rng.standard_normal(img.shape))[..., None].astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(img).repeat().batch(ctx.get_per_replica_batch_size(GLOBAL)).prefetch(2)


it = iter(strategy.distribute_datasets_from_function(dataset_fn))


def critic_update(real, rng):
    n = tf.shape(real)[0]
    fake = gen(rng.normal((n, LATENT)), training=True)
    with tf.GradientTape() as tape:
        eps = rng.uniform((n, 1, 1, 1))
        mixed = eps * real + (1 - eps) * fake
        with tf.GradientTape() as gp_tape:
            gp_tape.watch(mixed)
            mixed_score = crit(mixed, training=True)
        slope = tf.sqrt(tf.reduce_sum(tf.square(gp_tape.gradient(mixed_score, mixed)), axis=[1, 2, 3]) + 1e-12)
        per_example = crit(fake, training=True)[:, 0] - crit(real, training=True)[:, 0] + GP * tf.square(slope - 1)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
    c_opt.apply_gradients(zip(tape.gradient(loss, crit.trainable_variables), crit.trainable_variables))
    return loss


def generator_update(n, rng):
    with tf.GradientTape() as tape:
        per_example = -crit(gen(rng.normal((n, LATENT)), training=True), training=True)[:, 0]
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
    g_opt.apply_gradients(zip(tape.gradient(loss, gen.trainable_variables), gen.trainable_variables))
    return loss


@tf.function
def train_step(batches):
    def replica_step(*reals):
        rng = noise  # made in the strategy's scope: each replica draws its own stream
        c_loss = tf.add_n([critic_update(real, rng) for real in reals]) / len(reals)
        return c_loss, generator_update(tf.shape(reals[0])[0], rng)
    c_loss, g_loss = strategy.run(replica_step, args=batches)
    return {"critic": strategy.reduce("SUM", c_loss, axis=None), "generator": strategy.reduce("SUM", g_loss, axis=None)}


with tf_profile(args.out, steps=tuple(map(int, args.window.split(":"))), model=crit) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        reals = tuple(next(it) for _ in range(args.critic_steps))
        with prof.step(step):  # dagprof (3/3)
            losses = train_step(reals)
        if step % 4 == 3:
            print(f"step {step}: " + " ".join(f"{k} {v.numpy():.3f}" for k, v in losses.items()), flush=True)
