import numpy as np
import keras

keras.utils.set_random_seed(0)

rng = np.random.default_rng(0)
x = rng.standard_normal((512, 16)).astype("float32")
y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")

model = keras.Sequential([
    keras.Input((16,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(2, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, epochs=10, batch_size=64, verbose=2)
print("weights on", model.weights[0].value.device)
print("final accuracy", history.history["accuracy"][-1])
