set -x
export PYTHONPATH=. CUCONV_CACHE_DIR=/tmp/cc HYPOTHESIS_PROFILE=gpu
python devtmp/prewarm.py
python -m pytest -q -x -m gpu tests/test_hopper.py tests/test_conv3d_native.py -p no:cacheprovider 2>&1 | tail -15
python -m cuconv.bench --quick --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -v "^ " $OUT/bench.log | head -3; grep -E "geomean|C320|C1280|C512 |C128 512" -A3 $OUT/bench.log | head -60
python -m cuconv.bench_conv3d --dtype bfloat16 --json $OUT/bench3d.json 2>&1 | tail -20
