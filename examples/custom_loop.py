import numpy as np
import tensorflow as tf
import keras

keras.utils.set_random_seed(0)

rng = np.random.default_rng(1)
x = rng.standard_normal((256, 8)).astype("float32")
true_w = rng.standard_normal((8, 1)).astype("float32")
y = x @ true_w

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, use_bias=False)])
opt = keras.optimizers.Adam(0.05)


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for epoch in range(200):
    loss = step(x, y)
print("loss", float(loss), "weights on", model.weights[0].value.device)
