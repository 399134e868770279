"""png_colours.py IMAGE.png RRGGBB...: exits 1 unless every colour covers at least 100 pixels.

Decodes 8-bit RGB/RGBA PNGs with the standard library only (zlib and the five PNG row filters),
so the check needs no imaging package.
"""
import struct
import sys
import zlib


def rows(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, f"unsupported PNG: {depth}, {colour}, {interlace}"
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        yield line, channels
        previous = line


def main():
    wanted = {tuple(int(c[i:i + 2], 16) for i in (0, 2, 4)): 0 for c in sys.argv[2:]}
    for line, channels in rows(sys.argv[1]):
        for x in range(0, len(line), channels):
            pixel = line[x:x + 3]
            for colour in wanted:
                if all(abs(a - b) <= 8 for a, b in zip(pixel, colour)):
                    wanted[colour] += 1
    print("pixels per colour:", {"%02x%02x%02x" % c: n for c, n in wanted.items()})
    sys.exit(0 if all(n >= 100 for n in wanted.values()) else 1)


if __name__ == "__main__":
    main()
