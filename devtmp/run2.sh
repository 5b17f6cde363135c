export PYTHONPATH=. CUCONV_CACHE_DIR=/tmp/cc HYPOTHESIS_PROFILE=gpu
python devtmp/prewarm.py
python -m pytest -q -m gpu tests -p no:cacheprovider > $OUT/gpu_tests.log 2>&1; tail -5 $OUT/gpu_tests.log; grep -E "FAILED|Error" $OUT/gpu_tests.log | head -20
python -m cuconv.bench --quick --json $OUT/h100.json > $OUT/h100.log 2>&1; grep -E "host work|geomean" $OUT/h100.log
python -m cuconv.bench_conv3d --dtype bfloat16 --json $OUT/h100_conv3d.json > $OUT/h100_conv3d.log 2>&1; cat $OUT/h100_conv3d.log
python -m cuconv.bench_sm80 --json $OUT/h100_sm80.json > $OUT/h100_sm80.log 2>&1; tail -25 $OUT/h100_sm80.log
python -m cuconv.demo 2>&1 | tail -5
