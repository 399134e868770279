"""Times the two ways fax::conv2d can run k clients' convolutions (forward and backward, one
thread): one grouped convolution (the clients as groups) or a loop of per-client convolutions.
Run with Debian's python3 (its torch 1.13 uses the same oneDNN as fax's LibTorch):

    /usr/bin/python3 experiments/bench/conv_paths.py

Prints a Markdown table; core/src/nn/layers.cpp picks the loop below 16 input channels from it.
"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)


def ms(step, repeats=10):
    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1e3


# (model, clients k, batch, in channels, out channels, size, kernel, padding)
CASES = [
    ("lenet conv1", 5, 64, 1, 6, 28, 5, 0),
    ("lenet conv2", 5, 64, 6, 16, 12, 5, 0),
    ("cnn (McMahan) conv1", 5, 20, 1, 32, 28, 5, 2),
    ("cnn (McMahan) conv2", 5, 20, 32, 64, 14, 5, 2),
    ("resnet18_gn stem", 5, 20, 3, 64, 32, 3, 1),
    ("16 -> 32 channels", 5, 20, 16, 32, 14, 5, 2),
    ("32 -> 32 channels", 5, 20, 32, 32, 16, 3, 1),
    ("resnet18_gn block", 2, 32, 64, 64, 32, 3, 1),
]

print("| convolution | k x batch | in -> out channels, size, kernel | grouped | per-client loop | loop speedup |")
print("|---|---|---|---|---|---|")
for name, k, b, ic, oc, size, ks, pad in CASES:
    x = torch.randn(k, b, ic, size, size, requires_grad=ic > 3)
    w = torch.randn(k, oc, ic, ks, ks, requires_grad=True)
    bias = torch.randn(k, oc, requires_grad=True)

    def grouped():
        out = F.conv2d(x.transpose(0, 1).reshape(b, k * ic, size, size), w.reshape(k * oc, ic, ks, ks),
                       bias.reshape(-1), padding=pad, groups=k)
        out.sum().backward()

    def loop():
        torch.stack([F.conv2d(x[j], w[j], bias[j], padding=pad) for j in range(k)]).sum().backward()

    g, l = ms(grouped), ms(loop)
    print(f"| {name} | {k} x {b} | {ic} -> {oc}, {size}x{size}, {ks}x{ks} | {g:.2f} ms | {l:.2f} ms | {g / l:.2f}x |")
