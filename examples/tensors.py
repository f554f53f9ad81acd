import numpy as np
import tensorflow as tf

print("devices:", [d.name for d in tf.config.list_physical_devices()])
x = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")


@tf.function
def layer(x):
    w = tf.ones([32, 16]) * 0.1
    return tf.reduce_sum(tf.nn.relu(tf.matmul(x, w) - 0.2), axis=1)


with tf.device("/GPU:0"):
    g = layer(tf.constant(x))
with tf.device("/CPU:0"):
    c = layer(tf.constant(x))
print("ran on", g.device)
print("max difference to the CPU:", float(np.max(np.abs(g.numpy() - c.numpy()))))
