export PYTHONPATH=. CUCONV_CACHE_DIR=/tmp/cc HYPOTHESIS_PROFILE=gpu
python devtmp/prewarm.py
python -m pytest -q -m gpu tests/test_hopper.py tests/test_conv3d_native.py tests/test_conv3d_qslice.py -p no:cacheprovider 2>&1 | tail -4
python -m cuconv.bench_conv3d --dtype bfloat16 --json $OUT/h100_conv3d.json > $OUT/h100_conv3d.log 2>&1; cat $OUT/h100_conv3d.log
